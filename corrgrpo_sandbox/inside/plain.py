"""The plain-data codec, on both sides of the status channel.

Runs inside the sandbox (the runner encodes what a called entry returned) and on the host
(:mod:`corrgrpo_sandbox.calls` decodes it, under bounds). The node format is documented there.
Standard library only, and no module imports at all: it is sent to a ``python -I -S``
interpreter as text, in front of the runner.
"""


class _PlainError(Exception):
    """The value is not plain data (the message names the offending type)."""


class _PlainBound(_PlainError):
    """The record is over a bound of the decode (its value would cost too much to build or use)."""


def _plain_encode(value, classes=(), max_nodes=1000000):
    # Iterative post-order walk: children get their node index before their parent.
    nodes = []
    index = {}
    active = set()
    stack = [(value, False)]
    while stack:
        obj, ready = stack.pop()
        key = id(obj)
        if not ready and key in index:
            continue
        kind = type(obj)
        node = _plain_atom_node(obj, kind)
        if node is None:
            children, attrs = _plain_children(obj, kind, classes)
            if not ready:
                _plain_push(obj, key, children, active, stack)
                continue
            active.discard(key)
            node = _plain_container_node(kind, [index[id(c)] for c in children], attrs)
        # Every object walked is reachable from ``value``, so no id() is reused meanwhile.
        index[key] = len(nodes)
        nodes.append(node)
        if len(nodes) > max_nodes:
            raise _PlainError("too large")
    return nodes


def _plain_atom_node(obj, kind):
    # The node of an atom; None for anything else. (Exact types: ``is``, never a call into the
    # value's own class.)
    if obj is None:
        return ["N"]
    if kind is bool:
        return ["B", 1 if obj else 0]
    if kind is int:
        return ["I", int.__format__(obj, "#x")]
    if kind is float:
        return ["F", float.__repr__(obj)]
    if kind is str:
        return ["S", obj]
    if kind is bytes:
        return ["Y", bytes.hex(obj)]
    return None


def _plain_children(obj, kind, classes):
    # (the values a container or an object of ``classes`` holds, in node order; its attribute
    # dict for an object, else None)
    if kind is list or kind is tuple:
        return list(obj), None
    if kind is set or kind is frozenset:
        return list(obj), None
    if kind is dict:
        return [x for pair in dict.items(obj) for x in pair], None
    if getattr(kind, "__name__", None) in classes:
        attrs = object.__getattribute__(obj, "__dict__")
        if type(attrs) is not dict or any(type(k) is not str for k in attrs):
            raise _PlainError(kind.__name__)
        return list(dict.values(attrs)), attrs
    raise _PlainError(getattr(kind, "__name__", "?"))


def _plain_push(obj, key, children, active, stack):
    # First visit of a container: walk its children first, then come back to it.
    if key in active:
        raise _PlainError("cycle")
    active.add(key)
    stack.append((obj, True))
    for child in reversed(children):
        if id(child) in active:
            raise _PlainError("cycle")
        stack.append((child, False))


def _plain_container_node(kind, ids, attrs):
    if kind is list:
        return ["L", ids]
    if kind is tuple:
        return ["T", ids]
    if kind is set:
        return ["E", ids]
    if kind is frozenset:
        return ["Z", ids]
    if kind is dict:
        return ["D", ids]
    return ["O", kind.__name__, [[k, i] for k, i in zip(attrs, ids)]]


def _plain_decode(nodes, classes=None, max_nodes=1000000, bounds=None):
    # ``classes``: name -> class for "O" nodes (None: objects are not accepted).
    # ``bounds``: None (trusted input), or (max_expanded, max_items, max_same_hash): the most
    # nodes the value (and, together, every set item and dict key hashed while building it)
    # would have with shared nodes expanded, a string counting one node per 16 characters;
    # the most items of one container; the most items of one set or dict with one hash.
    # Everything a check does to a value (==, hash, repr, a walk) costs its expanded size, not
    # its text's: a tuple referencing one node twice, 64 levels deep, is 64 nodes of text
    # and 2**64 to hash.
    if type(nodes) is not list or not nodes or len(nodes) > max_nodes:
        raise _PlainError("malformed")
    weight = [] if bounds is not None else None  # each node's expanded size (capped)
    hashed = 0
    built = []
    for node in nodes:
        if type(node) is not list or not node or type(node[0]) is not str:
            raise _PlainError("malformed")
        tag, n = node[0], len(node)
        if tag == "N" and n == 1:
            value, size = None, 1
        elif n < 2:
            raise _PlainError("malformed")
        elif tag in "LTEZD" and n == 2 and len(tag) == 1 and type(node[1]) is list:
            value, size, hashed = _plain_build_container(tag, node[1], built, weight, bounds,
                                                         hashed)
        elif tag == "O" and n == 3 and classes is not None and node[1] in classes \
                and type(node[2]) is list:
            value, size = _plain_build_object(classes[node[1]], node[2], built, weight, bounds)
        else:
            value = _plain_atom_value(tag, n, node[1])
            # an atom: one node, and one per 16 characters of its text
            size = 1 + (len(node[1]) >> 4 if type(node[1]) is str else 0)
        built.append(value)
        if weight is not None:
            weight.append(size)
    if weight is not None and weight[-1] > bounds[0]:
        raise _PlainBound(f"{weight[-1]}+ nodes with shared nodes expanded")
    return built[-1]


def _plain_atom_value(tag, n, arg):
    if n == 2:
        if tag == "B" and arg in (0, 1) and type(arg) is int:
            return arg == 1
        if tag == "I" and type(arg) is str and len(arg) <= 100000:
            return int(arg, 16)
        if tag == "F" and type(arg) is str and len(arg) <= 40:
            return float(arg)
        if tag == "S" and type(arg) is str:
            return arg
        if tag == "Y" and type(arg) is str:
            return bytes.fromhex(arg)
    raise _PlainError("malformed")


def _plain_items(refs, built):
    # The values a container node references (each an earlier node).
    here = len(built)
    for i in refs:
        if type(i) is not int or not 0 <= i < here:
            raise _PlainError("malformed")
    return [built[i] for i in refs]


def _plain_build_container(tag, refs, built, weight, bounds, hashed):
    # (the container, its expanded size, the expanded nodes hashed so far)
    items = _plain_items(refs, built)
    size = None
    if bounds is not None:  # checked before any set or dict is built
        size, hashed = _plain_weigh(tag, refs, items, weight, bounds, hashed)
    if tag == "L":
        return items, size, hashed
    if tag == "T":
        return tuple(items), size, hashed
    if tag == "E":
        return set(items), size, hashed
    if tag == "Z":
        return frozenset(items), size, hashed
    if len(items) % 2:
        raise _PlainError("malformed")
    return dict(zip(items[0::2], items[1::2])), size, hashed


def _plain_weigh(tag, refs, items, weight, bounds, hashed):
    max_expanded, max_items, max_same_hash = bounds
    if len(refs) > max_items:
        raise _PlainBound(f"container of {len(refs)} items")
    size = 1
    for i in refs:
        size += weight[i]
    size = size if size <= max_expanded else max_expanded + 1
    if tag in "EZD":
        keys = refs if tag != "D" else refs[0::2]
        for i in keys:
            hashed += weight[i]
        if hashed > max_expanded:
            raise _PlainBound(f"hashing {hashed}+ expanded nodes")
        same = {}
        for item in (items if tag != "D" else items[0::2]):
            h = hash(item)
            count = same.get(h, 0) + 1
            if count > max_same_hash:
                raise _PlainBound(f"more than {max_same_hash} keys with one hash")
            same[h] = count
    return size, hashed


def _plain_build_object(cls, pairs, built, weight, bounds):
    # An instance of a trusted class, made without calling its __init__.
    obj = cls.__new__(cls)
    here = len(built)
    size = 1
    for pair in pairs:
        if (type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str
                or type(pair[1]) is not int or not 0 <= pair[1] < here):
            raise _PlainError("malformed")
        obj.__dict__[pair[0]] = built[pair[1]]
        if bounds is not None:
            size += weight[pair[1]]
    if bounds is None:
        return obj, None
    if len(pairs) > bounds[1]:
        raise _PlainBound(f"object of {len(pairs)} attributes")
    return obj, (size if size <= bounds[0] else bounds[0] + 1)
