"""Command lines: ``gridvqa`` (``reproduction.cli.gridvqa``) and ``modality-bias``
(``reproduction.cli.bias``), thin shells over the methods and the reproduction layer."""
