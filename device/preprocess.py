"""The one preprocessing definition, shared by the build side and the device side.

The pipeline trains and evaluates on exactly what :class:`Preprocess` produces, and the
device agent feeds an engine with the same function, so a model's accuracy on the build
host carries over to the device. Only numpy and OpenCV: no torch here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


from device.errors import ConfigError, require
from device.pil_resize import resize_antialiased

# bilinear_antialias: PIL's and torchvision's bilinear (Resize's default), whose triangle filter widens with the
# reduction, as a network trained on their resize saw its images; OpenCV's INTER_LINEAR samples 2×2 pixels whatever
# the reduction (a 1024 → 224 resize reads 1 pixel in 20). Within 1 level of torchvision's (a test).
_INTERPOLATIONS = ("bilinear", "area", "nearest", "bicubic", "bilinear_antialias")


def _cv2():
    return require("cv2", "OpenCV", "pip install 'opencv-python-headless<5'")


@dataclass(frozen=True)
class Preprocess:
    """Resize the shorter side, center-crop, match channels, scale to [0,1], normalize.

    Attributes:
        input_size: Side of the square network input.
        resize: Shorter side after resizing, before the center crop (≥ input_size).
        channels: 1 or 3; grey images are repeated to 3 channels, RGB turned grey for 1.
        mean: Per-channel mean on the [0,1] scale.
        std: Per-channel standard deviation on the [0,1] scale.
        interpolation: OpenCV interpolation for the resize.
        channel_order: ``rgb``, or ``bgr`` for a model trained on BGR images (OpenCV's order, Caffe's); the image
            given is RGB and is reversed for it. ``mean`` and ``std`` are in the model's order.
    """

    input_size: int
    resize: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    channel_order: str = "rgb"

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise ConfigError(f"channels must be 1 or 3, got {self.channels}")
        if self.resize < self.input_size:
            raise ConfigError(f"resize ({self.resize}) must be ≥ input_size ({self.input_size})")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ConfigError(
                f"mean and std need {self.channels} values (one per channel), got {len(self.mean)} and {len(self.std)}"
            )
        if any(s <= 0 for s in self.std):
            raise ConfigError(f"std values must be positive, got {list(self.std)}")
        if self.interpolation not in _INTERPOLATIONS:
            raise ConfigError(f"interpolation must be one of {_INTERPOLATIONS}, got {self.interpolation!r}")
        if self.channel_order not in ("rgb", "bgr") or (self.channel_order == "bgr" and self.channels != 3):
            raise ConfigError(f"channel_order {self.channel_order!r} with {self.channels} channel(s): rgb, or bgr "
                              "for a 3-channel model")

    # -- serialisation: recorded in the manifest and shipped to the device with the model --
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["mean"], data["std"] = list(self.mean), list(self.std)
        if self.channel_order == "rgb":  # the default left out: a record (and its cache key) as before BGR existed
            del data["channel_order"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Preprocess":
        known = {"input_size", "resize", "channels", "mean", "std", "interpolation", "channel_order"}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown preprocessing keys {sorted(unknown)}", fix=f"allowed: {sorted(known)}")
        missing = known - {"interpolation", "channel_order"} - set(data)
        if missing:
            raise ConfigError(f"missing preprocessing keys {sorted(missing)}", fix=f"give all of {sorted(known)}")
        return cls(**{**data, "mean": tuple(data["mean"]), "std": tuple(data["std"])})

    # -- the two halves: geometry (uint8, per image) and normalisation (float, batched) --
    def geometry(self, image: np.ndarray) -> np.ndarray:
        """Resizes and center-crops one uint8 image (H×W or H×W×C, RGB), matches channels, and puts them in the
        model's order.

        Returns:
            uint8 array of shape (input_size, input_size, channels).
        """
        cv2 = _cv2()
        if image.dtype != np.uint8:
            raise ConfigError(f"images must be uint8, got {image.dtype}")
        if image.ndim == 3 and image.shape[2] == 1:
            image = image[:, :, 0]
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (3, 4)):
            raise ConfigError(f"expected an H×W grey or H×W×3 RGB image, got shape {image.shape}")
        if image.ndim == 3 and image.shape[2] == 4:
            image = image[:, :, :3]
        height, width = image.shape[:2]
        scale = self.resize / min(height, width)
        new_h, new_w = max(self.resize, round(height * scale)), max(self.resize, round(width * scale))
        if (new_h, new_w) != (height, width) and self.interpolation == "bilinear_antialias":
            image = resize_antialiased(image, new_h, new_w)
        elif (new_h, new_w) != (height, width):
            flag = {
                "bilinear": cv2.INTER_LINEAR,
                "area": cv2.INTER_AREA,
                "nearest": cv2.INTER_NEAREST,
                "bicubic": cv2.INTER_CUBIC,
            }[self.interpolation]
            image = cv2.resize(image, (new_w, new_h), interpolation=flag)
        top, left = (new_h - self.input_size) // 2, (new_w - self.input_size) // 2
        image = image[top : top + self.input_size, left : left + self.input_size]
        if image.ndim == 2:
            image = image[:, :, None]
        if self.channels == 3 and image.shape[2] == 1:
            image = np.repeat(image, 3, axis=2)
        elif self.channels == 1 and image.shape[2] == 3:
            image = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)[:, :, None]
        if self.channel_order == "bgr":
            image = image[:, :, ::-1]
        return np.ascontiguousarray(image)

    def normalize(self, batch: np.ndarray) -> np.ndarray:
        """uint8 N×H×W×C → float32 N×C×H×W, scaled to [0,1] and normalized."""
        mean = np.asarray(self.mean, dtype=np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(self.std, dtype=np.float32).reshape(1, -1, 1, 1)
        data = batch.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
        return np.ascontiguousarray((data - mean) / std)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """One image → the network input, float32 1×C×H×W."""
        return self.normalize(self.geometry(image)[None])

    def input_shape(self, batch: int = 1) -> tuple[int, int, int, int]:
        return (batch, self.channels, self.input_size, self.input_size)


def read_image(path: str) -> np.ndarray:
    """Decodes an image file with OpenCV into uint8 RGB (or grey).

    Raises:
        ConfigError: If the file cannot be decoded.
    """
    cv2 = _cv2()
    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise ConfigError(f"cannot decode image {path}", fix="remove or replace the file (OpenCV could not read it)")
    if image.dtype == np.uint16:
        image = (image // 257).astype(np.uint8)
    if image.ndim == 3 and image.shape[2] == 4:
        image = cv2.cvtColor(image, cv2.COLOR_BGRA2RGB)
    elif image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    return image
