"""Learning runs and studies: what training does to the rewards, over seeds and stages.

Run them as modules from the checkout's root (``python -m studies.study``), so that the
project's packages import as installed and no file here can shadow a package.
"""
