"""The one exception type for bad user input.

Entry points catch :class:`InputError` and print its message on one line (no traceback), because
a typo in a YAML file or a wrong data path is the user's to fix, not a bug to debug.
"""


class InputError(ValueError):
    """Bad input from the user: a path, a camera, an option key, an image or a checkpoint."""
