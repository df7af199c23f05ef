"""A package registering architectures under the ``edgefold.architectures`` entry-point group, really installed.

pip builds it from files written here and installs it into a directory of its own; a child process with that
directory on ``PYTHONPATH`` finds it as importlib.metadata finds any installed distribution. The test environment
itself is never changed.
"""

import subprocess
import sys
import textwrap

PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "1.2.3"

        [tool.setuptools]
        packages = ["{module}"]

        [project.entry-points."edgefold.architectures"]
        {entries}
        """,
    "{module}/__init__.py": """
        def build(num_classes, in_channels=3):
            from torch import nn
            return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                 nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))

        MY_NET = {{"build": build, "classifier": "8"}}
        NOT_AN_ARCH = 42
        """,
}


def install(tmp_path, dist: str, entries: str):
    """pip installs a package registering ``entries`` into a directory of its own; returns that directory."""
    module = dist.replace("-", "_")
    source = tmp_path / f"src-{dist}"
    for name, text in PACKAGE.items():
        path = source / name.format(module=module)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).format(dist=dist, module=module, entries=entries))
    target = tmp_path / f"site-{dist}"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(target), str(source)], check=True, capture_output=True)
    return target
