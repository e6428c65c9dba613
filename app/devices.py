"""Device names from the ``devices`` setting, resolved to the devices that are really there."""

from __future__ import annotations

import torch

from app.errors import ConfigError, first_line


def resolve_devices(spec: str) -> list[torch.device]:
    """``cpu``, ``cuda``, ``cuda:0,cuda:1``, ``cpu,cpu`` or ``auto`` (every GPU, else the CPU).

    Raises ConfigError naming a device that is not there."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if names == ["auto"]:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [torch.device("cuda", i) for i in range(count)] or [torch.device("cpu")]
    devices = []
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError as exc:
            raise ConfigError(f"devices: {name!r} is not a device name") from exc
        if device.type == "cuda":
            index = 0 if device.index is None else device.index
            if not torch.cuda.is_available() or index >= torch.cuda.device_count():
                raise ConfigError(
                    f"devices: {name} requested but no such CUDA device is available"
                )
            device = torch.device("cuda", index)
        elif device.type != "cpu":
            raise ConfigError(f"devices: {name} is not supported (cpu or cuda)")
        devices.append(device)
    if not devices:
        raise ConfigError("devices: the list is empty")
    return devices


def devices_among(spec: str, server: list[torch.device]) -> list[torch.device]:
    """A model's devices: ``auto`` is every device of the server (``server``); the devices
    another spec names must be among them (ConfigError otherwise)."""
    if spec.strip() == "auto":
        return list(dict.fromkeys(server))
    wanted = resolve_devices(spec)
    missing = [str(d) for d in wanted if d not in server]
    if missing:
        raise ConfigError(f"devices {', '.join(missing)} are not among the server's "
                          f"({', '.join(str(d) for d in server)})")
    return list(dict.fromkeys(wanted))


THREAD_PREFIX = "device-"  # a device thread's name: device-cpu, device-cuda:0


class DeviceFault(Exception):
    """The device can no longer be used: its device thread stops, and is not restarted."""


def device_fault(device: torch.device) -> str | None:
    """Why ``device`` can no longer be used after a model call on it failed (None: it can).
    A CUDA context with a sticky error (an illegal memory access, a device-side assert, a
    launch failure) fails every later call, a synchronize included, until the process ends;
    an error of the call alone (a bad argument, a shape) leaves it working. The CPU keeps no
    such state."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
    except RuntimeError as exc:  # torch.AcceleratorError from torch 2.8 on
        return first_line(exc)
    return None
