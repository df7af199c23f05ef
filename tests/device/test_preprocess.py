import numpy as np
import pytest

from device.errors import ConfigError
from device.preprocess import Preprocess, read_image


def make(**kw):
    base = dict(input_size=4, resize=4, channels=3, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    base.update(kw)
    return Preprocess(**base)


def test_grey_image_becomes_normalized_three_channel_nchw():
    image = np.full((4, 4), 255, dtype=np.uint8)
    out = make()(image)
    assert out.shape == (1, 3, 4, 4) and out.dtype == np.float32
    np.testing.assert_allclose(out, (1.0 - 0.5) / 0.25)


def test_resize_shorter_side_then_center_crop():
    # A 4×8 image with a distinct left, centre and right: the crop keeps the centre.
    image = np.zeros((4, 8, 3), dtype=np.uint8)
    image[:, 2:6] = 200
    geometry = make(input_size=4, resize=4).geometry(image)
    assert geometry.shape == (4, 4, 3)
    assert (geometry == 200).all()


def test_upscale_uses_the_shorter_side():
    out = make(input_size=32, resize=32).geometry(np.zeros((28, 56), dtype=np.uint8))
    assert out.shape == (32, 32, 3)


def test_rgb_to_grey_for_single_channel_models():
    image = np.zeros((4, 4, 3), dtype=np.uint8)
    image[..., 1] = 255  # pure green → 0.587 · 255 in BT.601
    out = make(channels=1, mean=(0.0,), std=(1.0,))(image)
    assert out.shape == (1, 1, 4, 4)
    np.testing.assert_allclose(out, 150 / 255, atol=1 / 255)


@pytest.mark.parametrize("kw, message", [
    (dict(channels=2), "channels must be 1 or 3"),
    (dict(resize=2), "must be ≥ input_size"),
    (dict(mean=(0.5,)), "mean and std need 3 values"),
    (dict(std=(0.1, 0.0, 0.1)), "std values must be positive"),
    (dict(interpolation="lanczos9"), "interpolation must be one of"),
    (dict(channel_order="bgr", channels=1, mean=(0.5,), std=(0.5,)), "rgb, or bgr for a 3-channel model"),
    (dict(channel_order="brg"), "channel_order 'brg'"),
])
def test_bad_definitions_are_refused(kw, message):
    with pytest.raises(ConfigError, match=message):
        make(**kw)


def test_round_trip_through_dict():
    p = make(interpolation="area")
    assert Preprocess.from_dict(p.to_dict()) == p
    with pytest.raises(ConfigError, match="unknown preprocessing keys"):
        Preprocess.from_dict({**p.to_dict(), "flip": True})


def test_a_bgr_model_gets_the_channels_reversed_and_its_record_says_so():
    image = np.zeros((8, 8, 3), np.uint8)
    image[..., 0], image[..., 2] = 200, 10  # red
    rgb, bgr = make(input_size=8, resize=8), make(input_size=8, resize=8, channel_order="bgr")
    assert rgb.geometry(image)[0, 0].tolist() == [200, 0, 10] and bgr.geometry(image)[0, 0].tolist() == [10, 0, 200]
    assert "channel_order" not in rgb.to_dict(), "an RGB record is the one written before BGR existed"
    assert bgr.to_dict()["channel_order"] == "bgr" and Preprocess.from_dict(bgr.to_dict()) == bgr


def test_read_image_decodes_bgr_files_as_rgb(tmp_path):
    import cv2

    bgr = np.zeros((5, 6, 3), dtype=np.uint8)
    bgr[..., 2] = 255  # red in OpenCV's BGR order
    path = tmp_path / "red.png"
    cv2.imwrite(str(path), bgr)
    rgb = read_image(str(path))
    assert rgb.shape == (5, 6, 3) and (rgb[..., 0] == 255).all() and (rgb[..., 2] == 0).all()


def test_read_image_refuses_garbage(tmp_path):
    path = tmp_path / "broken.png"
    path.write_bytes(b"not an image")
    with pytest.raises(ConfigError, match="cannot decode image"):
        read_image(str(path))


def test_real_photograph_parity_with_torchvision_style_pipeline():
    """The OpenCV definition matches an independent numpy reimplementation on a real photo."""
    skimage_data = pytest.importorskip("skimage.data", reason="scikit-image ships real photographs")
    photo = skimage_data.astronaut()  # 512×512 RGB
    p = make(input_size=224, resize=256, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    out = p(photo)
    import cv2

    resized = cv2.resize(photo, (256, 256), interpolation=cv2.INTER_LINEAR)[16:240, 16:240]
    expected = (resized.astype(np.float32) / 255 - np.array(p.mean, np.float32)) / np.array(p.std, np.float32)
    np.testing.assert_allclose(out[0], expected.transpose(2, 0, 1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape, new", [((480, 640, 3), (224, 298)), ((100, 60, 1), (32, 19)), ((37, 53, 3), (36, 52)),
                                        ((8, 8, 3), (16, 16))])
def test_the_antialiased_resize_is_torchvisions_within_one_level(shape, new):
    """``bilinear_antialias`` is the resize torchvision's ``Resize`` and PIL's bilinear apply (its filter widens with the
    reduction): at most 1 level of 255 from either, shrinking or enlarging, grey or RGB. OpenCV's bilinear is far off
    when shrinking, which is why a model trained on torchvision's resize loses accuracy when fed by it."""
    torch = pytest.importorskip("torch")
    from PIL import Image
    from torchvision.transforms.v2 import functional as F

    from device.preprocess import resize_antialiased

    rng = np.random.default_rng(0)
    image = (np.cumsum(rng.integers(0, 256, shape), axis=0) % 256).astype(np.uint8)
    ours = resize_antialiased(image, *new).astype(int)
    theirs = F.resize(torch.from_numpy(image).permute(2, 0, 1), list(new), antialias=True).permute(1, 2, 0).numpy()
    pil = np.stack([np.asarray(Image.fromarray(image[:, :, c]).resize(new[::-1], Image.BILINEAR))
                    for c in range(shape[2])], axis=2)
    assert ours.shape == (*new, shape[2])
    assert np.abs(ours - theirs).max() <= 1 and np.abs(ours - pil).max() <= 1
    pre = Preprocess(input_size=min(new), resize=min(new), channels=shape[2] if shape[2] == 3 else 1,
                     mean=(0.5,) * (3 if shape[2] == 3 else 1), std=(0.5,) * (3 if shape[2] == 3 else 1),
                     interpolation="bilinear_antialias")
    assert pre.geometry(image).shape == (min(new), min(new), pre.channels)


@pytest.mark.parametrize("shape, new", [((41, 53), (41, 23)), ((41, 53), (18, 53)), ((120, 160), (18, 24)),
                                        ((37, 29), (90, 71)), ((240, 320), (168, 224))])
def test_the_antialiased_resize_is_pils_to_the_bit(shape, new):
    """PIL's own integer arithmetic (22-bit fixed-point weights, each pass clipped to uint8): the resize a model
    trained with PIL was fed, to the bit, where one pass or both in PIL's usual order (the rows first) run; the
    shipped infer.py computes it with the same module."""
    from PIL import Image

    from device.pil_resize import resize_antialiased

    image = np.random.default_rng(3).integers(0, 256, (*shape, 3), np.uint8)
    theirs = np.asarray(Image.fromarray(image).resize(new[::-1], Image.BILINEAR))
    assert np.array_equal(resize_antialiased(image, *new), theirs)
