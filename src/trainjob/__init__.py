"""trainjob: distributed PyTorch training as real multi-node jobs, on one machine or on Kubernetes."""

__version__ = "0.1.0"
