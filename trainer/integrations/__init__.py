"""corrgrpo's multi-reward methods inside other trainers (TRL, verl).

Each module imports its trainer lazily, so importing this package needs neither.
"""
