"""repexp: Representation-Based Exploration (arXiv 2510.11686) as a reproducible pipeline."""

__version__ = "0.1.0"
