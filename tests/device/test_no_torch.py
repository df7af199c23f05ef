"""device/ must import without torch: a Jetson installs the agent without the build side."""

import subprocess
import sys

BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == 'torch' or name.startswith(('torch.', 'torchvision', 'torch_pruning')):
            raise ImportError('torch is blocked in this test')
sys.meta_path.insert(0, Block())
import pkgutil, importlib, device
for info in pkgutil.walk_packages(device.__path__, 'device.'):
    importlib.import_module(info.name)
print('ok', sorted(m for m in sys.modules if m.startswith('device')))
"""


def test_device_package_imports_without_torch(repo):
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH], cwd=repo, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "device.preprocess" in result.stdout and "device.registry" in result.stdout
