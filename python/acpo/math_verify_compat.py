"""Math-Verify's `parse` / `verify` pair, judged by acpo, for code written against Math-Verify.

    from acpo.math_verify_compat import parse, verify
    verify(parse(gold), parse(answer))          # as with `from math_verify import parse, verify`

`parse(text)` returns a list (a `Parsed`) of the answers acpo finds in the text, most preferred
first (empty when there is none, as Math-Verify's is), which also keeps the text; `verify(gold,
target)` judges the two texts with acpo's verifier. Strings are accepted where parse results
are. Math-Verify's timeouts (`parsing_timeout`, `timeout_seconds`) are accepted and have nothing
to do: acpo bounds the work of every judgement instead, so this works in any thread and never
hangs. Its other options are accepted at their defaults only (`float_rounding=6`,
`numeric_precision=15`, `strict=True`, `allow_set_relation_comp=False`), which acpo implements;
any other value raises ValueError rather than being ignored. The elements are strings, not
sympy expressions, and the numeric tolerance is acpo's (acpo-verify's crate documentation).
"""
from . import _native

__all__ = ["parse", "verify", "Parsed"]

_DEFAULTS = {"float_rounding": 6, "numeric_precision": 15, "strict": True, "allow_set_relation_comp": False}


class Parsed(list):
    """What `parse` found: the answers as strings (a list, as Math-Verify's result is), with
    the text they were found in (`.text`), which `verify` judges."""

    def __init__(self, text, answers):
        super().__init__(answers)
        self.text = text


def parse(pred, extraction_config=None, fallback_mode=None, extraction_mode=None, parsing_timeout=None,
          raise_on_error=False, **kwargs):
    """The answers in `pred` (a response, or a gold answer in any of its forms)."""
    if not isinstance(pred, str):
        raise TypeError(f"acpo.math_verify_compat.parse: pred must be str, not {type(pred).__name__}")
    found = _native.candidates(pred) or [a for a in _native.candidates(pred, gold=True) if a.strip()]
    return Parsed(pred, found)


def _text(x, what):
    if isinstance(x, Parsed):
        return x.text
    if isinstance(x, str):
        return x
    raise TypeError(
        f"acpo.math_verify_compat.verify: {what} must be what parse() returned or a str, "
        f"not {type(x).__name__}"
    )


def verify(gold, target, float_rounding=6, numeric_precision=15, strict=True, allow_set_relation_comp=False,
           timeout_seconds=None, raise_on_error=False):
    """Whether `target` states `gold` (both parse results or strings)."""
    given = {"float_rounding": float_rounding, "numeric_precision": numeric_precision, "strict": strict,
             "allow_set_relation_comp": allow_set_relation_comp}
    for name, value in given.items():
        if value != _DEFAULTS[name]:
            raise ValueError(
                f"acpo.math_verify_compat.verify: {name}={value!r} is not implemented; acpo judges as "
                f"Math-Verify's default {name}={_DEFAULTS[name]!r}"
            )
    return _native.verify(_text(gold, "gold"), _text(target, "target"), gold_name="gold", answer_name="target")
