"""Telemetry samplers behind one interface, sampled on their own thread over the timed window.

``Sampler.read()`` returns one sample of named values with their units in the names
(``power_mw``, ``rss_mb``); :class:`Trace` holds the timestamped samples of one window and
integrates them (energy is the time integral of power, never a smoothed average).
"""

from device.telemetry.base import Sampler, Trace

__all__ = ["Sampler", "Trace"]
