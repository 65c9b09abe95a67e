"""``python -m sim``: the entry point (``main``), the parser (``parser``) and one module per
command, with the options every single-configuration command shares (``options``)."""
