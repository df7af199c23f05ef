"""PIL's bilinear resize with antialiasing (``Image.resize(…, BILINEAR)``, torchvision's ``Resize``) in NumPy, to the
bit: the resize a model trained with PIL or torchvision was fed.

Standalone (NumPy only): the device's preprocessing (:mod:`device.preprocess`) imports it, and ``edgefold ship`` copies
it beside ``infer.py``, so that an application feeds the tensor the run measured, whatever Pillow it has (Pillow 13
runs the vertical pass first where the height shrinks much more than the width, python-pillow/Pillow#9549, which moves
some pixels by a level; this keeps the order of Pillow 12 and earlier, the rows first).
"""

from __future__ import annotations

import numpy as np

def antialias_weights(size: int, new: int) -> np.ndarray:
    """The new × size matrix of PIL's bilinear resampling weights along one axis (``ImagingResample``'s
    ``precompute_coeffs``): a triangle filter as wide as the reduction, centred on each output pixel's centre."""
    scale = size / new
    filterscale = max(scale, 1.0)
    centers = (np.arange(new) + 0.5) * scale
    first = np.maximum((centers - filterscale + 0.5).astype(np.int64), 0)
    last = np.minimum((centers + filterscale + 0.5).astype(np.int64), size)
    weights = np.zeros((new, size))
    for row, (center, lo, hi) in enumerate(zip(centers, first, last)):
        taps = np.maximum(0.0, 1.0 - np.abs((np.arange(lo, hi) - center + 0.5) / filterscale))
        weights[row, lo:hi] = taps / taps.sum()
    return weights


_PRECISION_BITS = 32 - 8 - 2
"""PIL's fixed point for 8-bit resampling (``Resample.c``): coefficients in units of 2^-22, a sum rounded by adding
half a unit and shifting back."""


def _fixed_point(weights: np.ndarray) -> np.ndarray:
    """PIL's ``normalize_coeffs_8bpc``: each weight × 2^22, rounded half away from zero."""
    scaled = weights * (1 << _PRECISION_BITS)
    return np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)


def resize_antialiased(image: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """A uint8 H×W(×C) image resized as PIL's ``Image.resize(…, BILINEAR)`` and torchvision's ``Resize`` (antialias)
    do, to the bit: PIL's two passes (the rows first, each clipped to uint8, then the columns; a pass whose size does
    not change is skipped, as PIL skips it), each in its integer arithmetic. The shipped ``infer.py`` runs PIL itself
    and feeds the same tensor."""
    def one_pass(planes: np.ndarray, weights: np.ndarray) -> np.ndarray:  # planes … × size → … × new
        summed = planes.astype(np.int64) @ _fixed_point(weights).T + (1 << (_PRECISION_BITS - 1))
        return np.clip(summed >> _PRECISION_BITS, 0, 255).astype(np.uint8)

    planes = np.moveaxis(image.reshape(*image.shape[:2], -1), 2, 0)  # C×H×W
    if new_w != image.shape[1]:
        planes = one_pass(planes, antialias_weights(image.shape[1], new_w))
    if new_h != image.shape[0]:
        planes = np.swapaxes(one_pass(np.swapaxes(planes, 1, 2), antialias_weights(image.shape[0], new_h)), 1, 2)
    return np.moveaxis(planes, 0, 2).reshape(new_h, new_w, *image.shape[2:])
