"""The builtins of a check's namespace: the usual ones, except that ``import random`` gives a
private module whose functions draw from ``Random(0)``. Used by the plan program (in the
sandbox, as text) and by the host's verdicts (imported), so both draw the same inputs."""


def _corrgrpo_check_builtins():
    import builtins
    import random as real
    import types

    private = types.ModuleType("random")
    private.__dict__.update(vars(real))
    rng = real.Random(0)
    for name in list(vars(real)):
        if not name.startswith("_") and hasattr(rng, name):
            setattr(private, name, getattr(rng, name))
    real_import = builtins.__import__

    def checked_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "random" and level == 0:
            return private
        return real_import(name, globals, locals, fromlist, level)

    table = dict(vars(builtins))
    table["__import__"] = checked_import
    return table
