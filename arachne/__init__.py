"""arachne: plan parallel training of transformers on dynamic heterogeneous GPU clusters."""

__version__ = "0.1.0"
