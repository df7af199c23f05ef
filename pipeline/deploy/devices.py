"""The devices a run is deployed to: ``EDGE=``/``DC=`` agent URLs, or a ``devices.yaml`` with groups.

    # devices.yaml
    token_file: ~/.config/edgefold/token        # default for every device
    groups:
      orin-nano: {role: edge, urls: [http://nano-1:8765, http://nano-2:8765]}
      dc:        {role: dc, urls: [http://gpu-1:8765], token_file: ~/.config/edgefold/dc-token}

With none configured, the deploy stage starts a loopback agent on this machine for the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from device.errors import ConfigError

Role = Literal["edge", "dc"]
# deploy/results.json: every device's outcome, each succeeded rung with a device.schema.JobResult.
DEPLOY_SCHEMA = "edgefold.deploy/2"


@dataclass(frozen=True)
class Device:
    """One agent: its name in the report, its role, URL, group, and where its token comes from."""

    name: str
    role: Role
    url: str
    group: str
    token_file: Optional[str] = None

    def token(self) -> str:
        from device.client import read_token

        return read_token(token_file=self.token_file)

    def public(self) -> dict[str, str]:
        """What identifies the device in the manifest (never the token)."""
        return {"name": self.name, "role": self.role, "url": self.url, "group": self.group}


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role
    urls: list[str] = Field(min_length=1)
    token_file: Optional[str] = None


class _DevicesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_file: Optional[str] = None
    groups: dict[str, _Group] = Field(min_length=1)


def _check_url(url: str, where: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"{where}: {url!r} is not an agent URL", fix="write it as http://HOST:8765")
    return url.rstrip("/")


def _group_devices(group: str, role: Role, urls: list[str], token_file: str | None, where: str) -> list[Device]:
    devices = []
    for index, url in enumerate(urls, start=1):
        name = group if len(urls) == 1 else f"{group}-{index}"
        devices.append(Device(name, role, _check_url(url, where), group, token_file))
    return devices


def load_devices(edge: str | None = None, dc: str | None = None, devices_file: str | os.PathLike | None = None,
                 token_file: str | None = None) -> list[Device]:
    """Devices from comma-separated ``edge``/``dc`` URLs and/or a devices file (empty: none configured)."""
    devices: list[Device] = []
    if devices_file:
        path = Path(devices_file).expanduser()
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except OSError as err:
            raise ConfigError(f"cannot read devices file {path}: {err.strerror}",
                              fix="pass DEVICES=path/to/devices.yaml, or EDGE=/DC= agent URLs") from None
        try:
            spec = _DevicesFile.model_validate(raw)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise ConfigError(f"{path}: {problems}", fix="see the format in pipeline/deploy/devices.py") from None
        for group, entry in spec.groups.items():
            devices += _group_devices(group, entry.role, entry.urls, entry.token_file or spec.token_file or token_file,
                                      f"{path}: groups.{group}")
    for role, urls in (("edge", edge), ("dc", dc)):
        if urls:
            devices += _group_devices(role, role, [u.strip() for u in urls.split(",") if u.strip()], token_file,
                                      f"{role.upper()}=")
    names = [d.name for d in devices]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"device names used twice: {duplicates}", fix="give each group a distinct name")
    return devices

def unmeasured_edges(results: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The edge devices of a deploy ``results.json`` when none of them measured any rung, else None.

    A loopback agent (no devices named) is not an edge device someone pointed the run at.
    """
    edges = [d for d in results.get("devices", []) if d.get("role") == "edge" and d.get("url") != "loopback"]
    if not edges or any(r.get("state") == "succeeded" for d in edges for r in d.get("rungs", {}).values()):
        return None
    return edges
