"""EdgeFold device side: what runs on the Jetson or GPU server.

Everything under ``device`` imports without torch, so a Jetson can install the agent alone.
The build side (``pipeline``) imports from here, never the other way round.
"""

__version__ = "0.1.0"
