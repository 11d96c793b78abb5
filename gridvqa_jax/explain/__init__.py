"""Multimodal explainers: perturbation, Shapley values and interactions, DIME, MultiViz, global synergy."""
