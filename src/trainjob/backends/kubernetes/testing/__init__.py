"""Test support for the Kubernetes backend: an API server stand-in and pod emulation in network namespaces."""
