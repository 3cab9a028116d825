"""Typed option specs: one table per option section, checked before anything runs.

YAML hands over whatever was typed (``ratio_u: forty percent`` is a string, ``lr: 1e-4`` without
a dot is a string too), and a wrong type found deep inside training costs a run. Each section
declares ``{key: spec}`` once (dotted keys reach into nested mappings) and :func:`check_options`
reports the first bad value as ``<section>.<key>: expected <what>, got <value>``. Plain Python,
so ``basicsr_ldt.ldt`` can use it without BasicSR.
"""
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Tuple, Type

MISSING = object()   # what lookup() returns for an absent key


@dataclass(frozen=True)
class Spec:
    """What a value must be: a predicate and the phrase that describes it in errors."""

    accepts: Callable[[Any], bool]
    expected: str


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(low: Optional[int] = None, high: Optional[int] = None) -> Spec:
    """An integer (not a bool, not a float) in ``[low, high]``."""
    if high is None:
        expected = 'an integer' if low is None else f'an integer >= {low}'
    else:
        expected = f'an integer in [{low}, {high}]'
    return Spec(lambda v: _is_int(v) and (low is None or v >= low) and (high is None or v <= high), expected)


def number(low: float, high: float, closed: str = '()') -> Spec:
    """A number in the interval ``low, high``; ``closed`` is its brackets, e.g. ``'[)'``."""
    above = (lambda v: v >= low) if closed[0] == '[' else (lambda v: v > low)
    below = (lambda v: v <= high) if closed[1] == ']' else (lambda v: v < high)
    return Spec(lambda v: _is_number(v) and above(v) and below(v),
                f"a number in {closed[0]}{low:g}, {high:g}{closed[1]}")


def boolean() -> Spec:
    return Spec(lambda v: isinstance(v, bool), 'true or false')


def auto_or_boolean() -> Spec:
    """``'auto'`` (the project decides by what was measured), ``true`` or ``false``: the same words,
    case and quoting for every such key (a quoted ``'true'`` is text, as for every boolean key)."""
    return Spec(lambda v: isinstance(v, bool) or (isinstance(v, str) and v == 'auto'), "one of 'auto', true, false")


def string() -> Spec:
    return Spec(lambda v: isinstance(v, str) and v != '', 'a non-empty string')


def strings() -> Spec:
    """One string or a list of strings (YAML ``x`` or ``[x, y]``)."""
    return Spec(lambda v: isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v)),
                'a string or a list of strings')


def whole(low: int) -> Spec:
    """A whole number >= ``low``: an integer, or a float without a fraction (``5000.0``), as BasicSR's
    ``int()`` and ``%`` read iteration counts and frequencies."""
    return Spec(lambda v: _is_number(v) and float(v).is_integer() and v >= low, f'a whole number >= {low}')


def items(spec: Spec, length: Optional[int] = None) -> Spec:
    """A non-empty list whose every item is ``spec`` (YAML ``[a, b]``), of ``length`` items if given."""
    size = (lambda v: len(v) > 0) if length is None else (lambda v: len(v) == length)
    return Spec(lambda v: isinstance(v, (list, tuple)) and size(v) and all(spec.accepts(x) for x in v),
                f"a {'non-empty list' if length is None else f'list of {length} items'}, each {spec.expected}")


def choice(*values: Any) -> Spec:
    return Spec(lambda v: isinstance(v, type(values[0])) and v in values,
                'one of ' + ', '.join(repr(v) for v in values))


def mapping(values: Optional[Spec] = None) -> Spec:
    """A mapping (YAML ``{...}``), optionally with every value matching ``values``."""
    if values is None:
        return Spec(lambda v: isinstance(v, Mapping), 'a mapping {key: value}')
    return Spec(lambda v: isinstance(v, Mapping) and all(isinstance(k, str) and values.accepts(x) for k, x in v.items()),
                f'a mapping of names to {values.expected}')


def optional(spec: Spec) -> Spec:
    """``spec`` or null (``~``)."""
    return Spec(lambda v: v is None or spec.accepts(v), f'{spec.expected}, or null')


def describe(value: Any) -> str:
    """The value as the user typed it, with a hint for YAML's exponent-without-dot trap."""
    text = repr(value)
    if isinstance(value, str) and value.lower() in ('true', 'false', 'yes', 'no', 'on', 'off'):
        return text + ' (text: write true or false without quotes)'
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return text
        return text + ' (text: YAML reads numbers like 1e-4 without a dot as strings; write 1.0e-4 or !!float 1e-4)'
    return text


def lookup(options: Mapping, dotted: str) -> Any:
    """``options['a']['b']`` for ``'a.b'``; a sentinel when a level is absent or not a mapping."""
    value: Any = options
    for part in dotted.split('.'):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def check_options(section: str, options: Mapping, specs: Mapping[str, Spec],
                  error: Type[Exception] = ValueError, name: Optional[Callable[[str], str]] = None,
                  yaml: bool = True) -> None:
    """Raise ``error('<section>.<key>: expected ..., got ...')`` for the first value off its spec.

    Keys absent from ``options`` are not checked (defaults apply); unknown keys are the caller's
    concern (:func:`basicsr_ldt.common.options.check_known_keys`). ``name`` says how a key is
    called where the values did not come from a YAML section (a keyword argument, a command-line
    flag); it replaces ``<section>.<key>``. ``yaml`` False (values from Python or a command line) leaves
    out the hints about how YAML reads text.
    """
    for key, spec in specs.items():
        value = lookup(options, key)
        if value is not MISSING and not spec.accepts(value):
            called = name(key) if name is not None else f'{section}.{key}' if section else key
            raise error(f'{called}: expected {spec.expected}, got {describe(value) if yaml else repr(value)}')


def auto_or_boolean_mode(options: Mapping, key: str, default: str, section: str,
                         error: Type[Exception] = ValueError) -> str:
    """``'auto'``, ``'true'`` or ``'false'`` for an :func:`auto_or_boolean` key of ``options`` (absent or
    null: ``default``), a bad value refused as :func:`check_options` refuses it."""
    value = options.get(key)
    value = default if value is None else value
    check_options(section, {key: value}, {key: auto_or_boolean()}, error)
    return str(value).lower()


__all__: Tuple[str, ...] = ('Spec', 'integer', 'number', 'whole', 'items', 'boolean', 'auto_or_boolean', 'string',
                            'strings', 'choice', 'mapping', 'optional', 'check_options', 'auto_or_boolean_mode',
                            'lookup', 'MISSING', 'describe')
