"""A batch argument of a framework's reward read into a list: a sequence, never a str (whose
characters are not answers) nor a mapping, and never more than `MAX_BATCH` items (an endless
iterable is a ValueError raised while it is read, not an exhausted memory)."""
from collections.abc import Mapping
from itertools import islice

from . import _native

MAX_BATCH = _native.MAX_BATCH


def as_list(items, what, where):
    """`items` as a list, or TypeError / ValueError naming `where` (the module) and `what`."""
    if items is None or isinstance(items, (str, bytes, bytearray, Mapping)):
        raise TypeError(f"{where}: {what} must be a sequence (a list or tuple), not {type(items).__name__}")
    try:
        it = iter(items)
    except TypeError:
        raise TypeError(f"{where}: {what} must be a sequence (a list or tuple), not {type(items).__name__}") from None
    out = list(islice(it, MAX_BATCH + 1))
    if len(out) > MAX_BATCH:
        raise ValueError(
            f"{where}: {what} has more than {MAX_BATCH} items, more than one batch may hold (an endless "
            f"iterable?): split it"
        )
    return out
