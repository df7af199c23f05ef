"""EdgeFold build side: recipe → data → teacher → prune → distill → evaluate (needs torch)."""

from device import __version__

__all__ = ["__version__"]
