"""Configuration: the section dataclasses (sections.py), ConfigDict -> dataclasses (parse.py),
config files and command-line overrides (files.py). The bottom layer: imports nothing heavy."""
