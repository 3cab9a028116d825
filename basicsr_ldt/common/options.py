"""Validation helpers shared by every option section the project adds."""
import difflib
from typing import Iterable, Mapping

from basicsr_ldt.common.errors import InputError


def closest_key_hint(key: str, valid: Iterable[str]) -> str:
    """A ' (did you mean ...?)' suffix when a valid key is close to ``key``, else ''."""
    match = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ''


def check_known_keys(section: str, given: Mapping, valid: Iterable[str]) -> None:
    """Refuse unknown keys up front: a misspelt option silently falling back to its default
    would cost a whole training run."""
    valid = set(valid)
    for key in given:
        if key not in valid:
            raise InputError(f"unknown option '{key}' in {section}{closest_key_hint(key, valid)}; "
                             f"valid keys: {', '.join(sorted(valid))}")


def registered(registry, name, what: str):
    """``registry.get(name)`` with an unknown name reported as bad input, listing the known ones."""
    if name not in registry:
        raise InputError(f"{what} '{name}' is not registered (known: {', '.join(sorted(k for k, _ in registry))})")
    return registry.get(name)


def validate_dataset_options(dataset_cls, section: str, dataset_opt: Mapping) -> None:
    """Type-check a dataset section by its path (``datasets.<section>``) when its class can."""
    validate = getattr(dataset_cls, 'validate_options', None)
    if validate is not None:
        validate(f'datasets.{section}', dataset_opt)
