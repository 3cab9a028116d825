"""Small pieces every part of the project shares: the one error type for bad input
(``errors``), option-checking helpers (``options``), reading option files as plain YAML and
BasicSR's ``parse_options`` after the check (``option_file``), the one schema of option keys
(``schema``), output folders and one-line failures (``outputs``), command-line flags that fail
in one line too (``flags``), process-group start-up for
``--launcher pytorch`` (``process_group``) and the torchvision alias BasicSR 1.4.2 needs
(``compat``). Nothing here imports the rest of the package.
"""
