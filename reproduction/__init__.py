"""Reproduction of the two papers, above both method packages: each paper's tables with the
paper's numbers beside ours, the findings and their verdicts, figures, the report
(``gridvqa reproduce``) and the command lines ``gridvqa`` and ``modality-bias``."""
