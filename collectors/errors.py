"""The errors that collectors raise, as one tree.

    CollectorError
    ├── SysfsError          a sysfs file is unreadable or holds a value we cannot parse
    ├── GpuBackendError     NVML (or the simulated backend) failed for a device or as a whole
    │   ├── _DeviceLost         NVML says a device is gone: its reading ends there (gpu.nvml, private)
    │   └── _CaptureProblem     bad nvidia-smi capture text at a line, raised whole as GpuBackendError
    │                           naming the file and line (gpu.replay, private)
    ├── LogParseError       a kernel or NCCL log line, or a step JSON line, is malformed
    │   └── StepRecordError     a step record breaks its contract: a missing or unknown key, a bad value,
    │                           a duplicate step (a ValueError too, as the hub and SDK users catch it)
    ├── CollectorConfigError    an unknown collector name, or an SDK setting the environment gets wrong
    │                           (a ValueError too, as callers of the SDK catch it)
    ├── CommandError        an external tool could not start, or was killed past a bound (collectors.commands)
    │   ├── CommandNotFound         its binary is not there
    │   ├── CommandTimedOut         it ran past its timeout and was killed
    │   └── CommandOutputTooLarge   it wrote more than the bound to stdout or stderr and was killed
    ├── HostAgentError      a command the host agent runs failed (not installed, exit status, timeout,
    │                       too much output), or the hub refused its report or could not be reached
    ├── PodResourcesError   the kubelet's PodResources API cannot be asked (no socket, permission,
    │                       timeout, a kubelet without v1 List): GPU series go without pod labels
    ├── CheckOutputError    a health check's tool (dcgmi, ping, iperf3) printed what its parser does not
    │                       accept; the check reports it as an ERROR result naming the line or field
    ├── WebConfigError      a --web.config.file (TLS, basic auth) breaks its format (collectors.webconfig)
    └── TimingError         a measured time that is no positive finite time (of an all-reduce, a copy
                            or a matmul), which would otherwise compare as a pass (checks.allreduce,
                            checks.gpu_perf)

Collectors catch theirs per sample or per device, report them through `ReadErrors` and go on: one bad file
never fails a scrape (config errors come at start-up). Each names its file, device, line or field.
"""

from __future__ import annotations


class CollectorError(Exception):
    """Base of every error raised by a collector."""


class SysfsError(CollectorError):
    """A sysfs file could not be read or parsed; the message names the path."""


class GpuBackendError(CollectorError):
    """A GPU backend call failed; the message names the device and the call."""


class LogParseError(CollectorError):
    """A log line could not be parsed; the message names the source and line number."""


class StepRecordError(LogParseError, ValueError):
    """A step record breaks the JSON-lines contract; the message names the key or the line."""


class CollectorConfigError(CollectorError, ValueError):
    """An unknown collector name, or a step SDK setting the environment gets wrong; the message names it."""


class CommandError(CollectorError):
    """An external tool could not start, or was killed past a bound; the message names the tool and why."""


class CommandNotFound(CommandError):
    """The tool's binary is not installed, or not at the path given."""


class CommandTimedOut(CommandError):
    """The tool ran past its timeout and was killed."""


class CommandOutputTooLarge(CommandError):
    """The tool wrote more than the bound to one stream and was killed."""


class HostAgentError(CollectorError):
    """A host agent's command or post failed; the message names the command or hub and why."""


class CheckOutputError(CollectorError):
    """A health check's tool printed output its parser does not accept; the message names where."""


class TimingError(CollectorError):
    """A measured time is not a positive finite number: no rate can be computed from it, and a NaN would
    compare as no slower than the reference (a peer's timing is hostile input too)."""


class PodResourcesError(CollectorError):
    """The kubelet's PodResources List could not be read; the message names the socket and the cause."""


class WebConfigError(CollectorError):
    """A --web.config.file is unreadable, not YAML, or has an unknown key or a bad value, certificate or
    hash; the message names the file and the key."""
