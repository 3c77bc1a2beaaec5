"""What each NVIDIA Xid code means and what to do about it: one table, looked up by code.

Codes, mnemonics, descriptions and NVIDIA's resolution buckets (immediate and investigatory action) are
taken from NVIDIA's Xid catalog for Ampere and newer GPUs (CATALOG_SOURCE, CATALOG_VERSION); codes that
catalog does not list would come from NVIDIA's older Xid documentation (LEGACY_SOURCE), which lists none
outside the catalog's 1..172, so every row's `source` is "catalog". For codes the catalog marks Unused,
the older documentation's meaning is kept in `legacy_description`. The fleetlens columns (likely cause,
severity, action) are ours, derived from the buckets by one rule (`derive`): the tables _ACTION_BY_BUCKET
and _CAUSE_BY_BUCKET, then the per-code _OVERRIDES, each with its reason. docs/xid-catalog.md explains it
and carries the table `python -m analytics.xid_catalog --markdown` prints. An unknown code is never
dropped: `lookup` answers an entry that says it is unknown.

    lookup(48).action    -> Action.RESET_GPU
    lookup(13).cause     -> Cause.APPLICATION
    worst_action([48, 63, 94]) -> Action.RESET_GPU
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

CATALOG_SOURCE = "NVIDIA Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)"
# NVIDIA's page carries no version or date of its own; the newest driver its table names is R575 (CUDA 12.9).
CATALOG_VERSION = "as published, read 2026-12 (undated page; newest driver it names: R575 / CUDA 12.9)"
LEGACY_SOURCE = "NVIDIA Xid Errors for older GPUs (docs.nvidia.com/deploy/xid-errors/archive/index.html)"
# The codes the older page lists: 1..143 without a gap, counting its "Reserved" ranges 126-136 and 138-139.
LEGACY_CODES = range(1, 144)

SEVERITIES = ("info", "warning", "critical")


class Cause(StrEnum):
    """Who most likely made the Xid happen."""

    APPLICATION = "application"
    DRIVER = "driver"
    HARDWARE = "hardware"
    THERMAL_POWER = "thermal_power"
    UNKNOWN = "unknown"


class Action(StrEnum):
    """What an operator should do, mildest first (the order `worst_action` ranks by)."""

    NONE = "none"
    RESTART_JOB = "restart_job"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    INSPECT = "drain_for_inspection"

    @property
    def drains(self) -> bool:
        """Whether the node must leave service for it: a reset, a reboot or an inspection."""
        return self in (Action.RESET_GPU, Action.REBOOT_NODE, Action.INSPECT)

    @property
    def rank(self) -> int:
        return list(Action).index(self)


@dataclass(frozen=True)
class XidInfo:
    """One catalog row: NVIDIA's columns, then fleetlens's judgement of it."""

    code: int
    mnemonic: str
    description: str
    immediate: str  # NVIDIA's resolution bucket, e.g. RESTART_APP, RESET_GPU, RESTART_BM, IGNORE
    investigatory: str  # e.g. CHECK_APP/CUDA, CONTACT_SUPPORT, WORKFLOW_XID_48
    cause: Cause
    severity: str  # info, warning or critical (analytics.detectors.base.SEVERITIES)
    action: Action
    documented: bool = True
    source: str = "catalog"  # "catalog", "legacy" (only in NVIDIA's older Xid page) or "none" (unknown)
    legacy_description: str = ""  # the older Xid page's meaning, where the catalog says Unused
    override: str = ""  # why fleetlens departs from the bucket rule for this code, if it does

    @property
    def by_application(self) -> bool:
        return self.cause is Cause.APPLICATION

    @property
    def unused(self) -> bool:
        """Whether NVIDIA marks the code Unused on Ampere and newer (deprecated, or Volta and older)."""
        return self.description == "Unused"


# NVIDIA's catalog, one row per code: (code, mnemonic, description, immediate bucket, investigatory bucket).
# Descriptions are NVIDIA's short ones; the few long ones are shortened in our words. An empty bucket is one
# the catalog leaves blank (162-172, and 142's investigatory action).
_ROWS: tuple[tuple[int, str, str, str, str], ...] = (
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP", "CONTACT_SUPPORT"),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (
        11,
        "ROBUST_CHANNEL_GR_ERROR_MISSING_HW",
        "Invalid or corrupted push buffer stream",
        "RESTART_APP",
        "CHECK_APP/CUDA",
    ),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY",
        "Graphics Engine Exception",
        "RESTART_APP",
        "WORKFLOW_XID_13",
    ),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "Unused", "IGNORE", "CONTACT_SUPPORT"),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    # The page's row 16 repeats CONTACT_SUPPORT in the investigatory column (and N/A; Unused after it).
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT", "CONTACT_SUPPORT"),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (
        25,
        "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY",
        "Invalid or illegal push buffer stream",
        "RESTART_APP",
        "CHECK_APP/CUDA",
    ),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (27, "ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (28, "ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (29, "ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP", "WORKFLOW_XID_31"),
    (
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "Invalid or corrupted push buffer stream",
        "RESTART_APP",
        "CHECK_APP/CUDA",
    ),
    (33, "ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (
        37,
        "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD",
        "Driver firmware error",
        "IGNORE",
        "CHECK_APP/CUDA",
    ),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE", "CONTACT_SUPPORT"),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (42, "ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", "CONTACT_SUPPORT"),
    (
        44,
        "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW",
        "Graphics Engine fault during context switch",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    (
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "Preemptive cleanup after earlier errors (typically several CUDA apps on a GPU that hit a DBE)",
        "WORKFLOW_XID_45",
        "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)",
    ),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU", "CONTACT_SUPPORT"),
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (
        54,
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "Auxiliary power is not connected to the GPU board",
        "CHECK_MECHANICALS",
        "CONTACT_SUPPORT",
    ),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (56, "DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (58, "FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (59, "PMU_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP", "INVESTIGATE_SW"),
    (61, "PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt (newer drivers)", "RESET_GPU", "CONTACT_SUPPORT"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", "IGNORE"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU", "CONTACT_SUPPORT"),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (
        66,
        "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION",
        "Illegal access by driver",
        "IGNORE",
        "INVESTIGATE_SW",
    ),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE", "CONTACT_SUPPORT"),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP", "CHECK_APP/CUDA"),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW", "UPDATE_SWFW"),
    (
        79,
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        "RESTART_BM",
        "CONTACT_SUPPORT",
    ),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP", "CHECK_APP/CUDA"),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (87, "NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (90, "LTC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (91, "RESERVED_XID", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", "CONTACT_SUPPORT"),
    (
        93,
        "INFOROM_ERASE_LIMIT_EXCEEDED",
        "Non-fatal violation of provisioned InfoROM wear limit",
        "IGNORE",
        "CONTACT_SUPPORT",
    ),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", "IGNORE (sympathetic)"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", "IGNORE (sympathetic)"),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE", "IGNORE"),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE", "IGNORE"),
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", "IGNORE", "XID_137_FLOW"),
    (
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "Context Switch Timeout Error",
        "RESET_GPU",
        "CONTACT_SUPPORT",
    ),
    (110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU", "INVESTIGATE_SW"),
    (111, "BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (112, "DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (113, "DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (114, "HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (115, "CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (116, "WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (117, "CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (118, "HEAD_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", "INVESTIGATE_SW"),
    (120, "GSP_ERROR", "GSP Error", "RESET_GPU", "INVESTIGATE_SW"),
    (121, "C2C_ERROR", "C2C Error", "IGNORE", "CONTACT_SUPPORT"),
    (122, "SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (123, "SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (124, "SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (125, "INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (126, "ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (127, "ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (128, "ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (129, "ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (130, "ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (131, "ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (132, "ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (133, "ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (134, "ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (135, "ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (136, "ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU", "INVESTIGATE_LINK_SI"),
    (137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE", "XID_137_FLOW"),
    (138, "ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU", "CONTACT_SUPPORT"),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE", "CONTACT_SUPPORT"),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT", ""),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU", "CONTACT_SUPPORT"),
    (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        "NVLINK: NVLPW_CTRL Error",
        "WORKFLOW_NVLINK5_ERR",
        "WORKFLOW_NVLINK5_ERR",
    ),
    (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM", "CONTACT_SUPPORT"),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE", "CONTACT_SUPPORT"),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE", "CONTACT_SUPPORT"),
    (
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "GPU Recovery Action Changed",
        "XID_154",
        "N/A Informational only regarding another Xid",
    ),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "RESET_GPU", "INVESTIGATE_SW_USER"),
    (156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU", "IGNORE"),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE", "CONTACT_SUPPORT"),
    (158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU", "CONTACT_SUPPORT"),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO"),
    (160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "IGNORE", "INVESTIGATE_SW"),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE", "INVESTIGATE_SW"),
    (162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", "", ""),
    (163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", "", ""),
    (164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", "", ""),
    (165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", "", ""),
    (
        166,
        "NVLINK_SECURE_CRYPTO_ERR",
        "Confidential-computing traffic seen before the link was set up for it",
        "",
        "",
    ),
    (167, "PCIE_FATAL_TIMEOUT", "PCIe fatal timeout", "", ""),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", "", ""),
    (169, "SEC2_HALT_ERROR", "Internal micro-controller halt", "", ""),
    (170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "", ""),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Accompanies Xid 48: the uncorrectable error was in DRAM", "", ""),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Accompanies Xid 48: the uncorrectable error was in SRAM", "", ""),
)

# Codes NVIDIA documents only in its older Xid page (LEGACY_SOURCE), as (code, mnemonic, description). That
# page lists codes 1..143 (LEGACY_CODES), all of which the catalog lists too, so there are none.
_LEGACY_ROWS: tuple[tuple[int, str, str], ...] = ()

# What the older Xid page says of codes the catalog marks Unused: what they meant on Volta and older GPUs.
_LEGACY_MEANING: dict[int, str] = {
    1: "Invalid or corrupted push buffer stream",
    2: "Invalid or corrupted push buffer stream",
    3: "Invalid or corrupted push buffer stream",
    4: "Invalid or corrupted push buffer stream; GPU semaphore timeout",
    5: "Unused",
    6: "Invalid or corrupted push buffer stream",
    7: "Invalid or corrupted push buffer address",
    9: "Driver error programming GPU",
    10: "Unused",
    12: "Driver error handling GPU exception",
    14: "Unused",
    15: "Unused",
    16: "Display engine hung",
    17: "Unused",
    18: "Bus mastering disabled in PCI Config Space",
    19: "Display Engine error",
    20: "Invalid or corrupted Mpeg push buffer",
    21: "Invalid or corrupted Motion Estimation push buffer",
    22: "Invalid or corrupted Video Processor push buffer",
    23: "Unused",
    24: "GPU semaphore timeout",
    26: "Framebuffer timeout",
    27: "Video processor exception",
    28: "Video processor exception",
    29: "Video processor exception",
    30: "GPU semaphore access error",
    33: "Internal micro-controller error",
    34: "Video processor exception",
    35: "Video processor exception",
    36: "Video processor exception",
    42: "Video processor exception",
    47: "Video processor exception",
    49: "Unused",
    50: "Unused",
    51: "Unused",
    52: "Unused",
    53: "Unused",
    55: "Unused",
    56: "Display Engine error",
    57: "Error programming video memory interface",
    58: "Unstable video memory interface detected; EDC error",
    59: "Internal micro-controller error (older drivers)",
    61: "Internal micro-controller breakpoint/warning (newer drivers)",
    65: "Video processor exception",
    73: "NVENC2 Error",
    81: "VGA Subsystem Error",
    87: "Reserved",
    90: "Reserved",
    91: "Reserved",
    108: "Reserved",
    111: "Display Bundle Error Event",
    112: "Display Supervisor Error",
    113: "DP Link Training Error",
    114: "Display Pipeline Underflow Error",
    115: "Display Core Channel Error",
    116: "Display Window Channel Error",
    117: "Display Cursor Channel Error",
    118: "Display Pixel Pipeline Error",
    122: "SPI PMU RPC Read Failure",
    123: "SPI PMU RPC Write Failure",
    124: "SPI PMU RPC Erase Failure",
    125: "Inforom FS Failure",
    138: "Reserved",
}

# The rule, step 2: NVIDIA's immediate-action bucket -> fleetlens action. The entries marked "ours" are
# buckets whose NVIDIA text needs more than the code to act on; docs/xid-catalog.md gives the reasoning.
_ACTION_BY_BUCKET: dict[str, Action] = {
    "IGNORE": Action.NONE,
    "RESTART_APP": Action.RESTART_JOB,
    "RESET_GPU": Action.RESET_GPU,
    "WORKFLOW_XID_48": Action.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": Action.RESET_GPU,
    "RESTART_BM": Action.REBOOT_NODE,
    "RESTART_VM": Action.REBOOT_NODE,
    "CONTACT_SUPPORT": Action.INSPECT,
    "CHECK_MECHANICALS": Action.INSPECT,
    # ours: the vGPU cannot start until its guest or host software is updated; a person must do it.
    "UPDATE_SWFW": Action.INSPECT,
    # ours: solo means restart Fabric Manager, otherwise follow the Xid it came with; from the code alone it
    # is the teardown of an aborted application, and the accompanying Xid carries any action.
    "WORKFLOW_XID_45": Action.NONE,
    # ours: 154 only restates the recovery action of the Xid it accompanies, which carries it already.
    "XID_154": Action.NONE,
    # ours: NVIDIA says take Xid 154's action if one is logged, else restart the application.
    "XID_154_EVAL": Action.RESTART_JOB,
    # ours: NVIDIA says reset the GPU if UVM or vGPU is in use, else ignore; CUDA jobs use UVM.
    "CHECK_UVM": Action.RESET_GPU,
    # ours: the catalog gives no bucket (codes 162-172); nothing is automated unless an override says so.
    "": Action.NONE,
}

# WORKFLOW_NVLINK5_ERR (144-150) needs the message's intrInfo and errorStatus decoded against NVIDIA's
# "XID 144-150 Decode" sheet; from the code alone fleetlens takes the most severe immediate action that
# sheet lists for the code.
_NVLINK5_DECODE_WORST: dict[int, str] = {
    144: "RESET_GPU",
    145: "RESET_GPU",
    146: "RESET_GPU",
    147: "IGNORE",
    148: "IGNORE",
    149: "RESET_GPU",
    150: "RESET_GPU",
}

# The rule, step 3: NVIDIA's bucket -> likely cause, looked up for the investigatory bucket first, then the
# immediate one; a bucket not here (CONTACT_SUPPORT, IGNORE, ...) says nothing of the cause.
_CAUSE_BY_BUCKET: dict[str, Cause] = {
    "CHECK_APP/CUDA": Cause.APPLICATION,
    "WORKFLOW_XID_13": Cause.APPLICATION,
    "WORKFLOW_XID_31": Cause.APPLICATION,
    "XID_137_FLOW": Cause.APPLICATION,
    "WORKFLOW_XID_48": Cause.HARDWARE,
    "WORKFLOW_NVLINK_ERR": Cause.HARDWARE,
    "WORKFLOW_NVLINK5_ERR": Cause.HARDWARE,
    "INVESTIGATE_LINK_SI": Cause.HARDWARE,
    "CHECK_MECHANICALS": Cause.HARDWARE,
    "INVESTIGATE_SW": Cause.DRIVER,
    "INVESTIGATE_SW_USER": Cause.DRIVER,
    "UPDATE_SWFW": Cause.DRIVER,
}

# The rule, step 4: per-code overrides, (cause or None, action or None, why). None keeps the rule's value.
_OVERRIDES: dict[int, tuple[Cause | None, Action | None, str]] = {
    32: (Cause.HARDWARE, None, "NVIDIA: PBDMA faults are mostly PCIe quality issues, not the application"),
    38: (Cause.DRIVER, None, "NVIDIA describes it as a driver firmware error (FECS watchdog timeout)"),
    43: (Cause.APPLICATION, None, "NVIDIA: a user application hit a software-induced fault; the GPU is fine"),
    45: (Cause.APPLICATION, None, "NVIDIA: logged when an application is aborted (Ctrl-C, kill, teardown)"),
    54: (Cause.THERMAL_POWER, None, "the GPU board's auxiliary power is not connected"),
    63: (Cause.HARDWARE, None, "a GPU memory row remapped (or page retired) after ECC errors"),
    64: (Cause.HARDWARE, None, "GPU memory row remapping (or page retirement) failed"),
    67: (Cause.DRIVER, None, "NVIDIA: illegal access by driver"),
    79: (Cause.HARDWARE, None, "NVIDIA: most often a hardware failure of the PCIe link or the GPU"),
    92: (Cause.HARDWARE, None, "GPU memory reports a high rate of corrected single-bit ECC errors"),
    94: (Cause.HARDWARE, None, "an uncorrectable memory (ECC) error, contained to one application"),
    95: (Cause.HARDWARE, None, "an uncorrectable memory (ECC) error that affects several applications"),
    110: (Cause.HARDWARE, None, "NVIDIA: uncommon unless the hardware failed"),
    121: (Cause.HARDWARE, None, "corrected errors on the C2C NVLink to the Grace CPU"),
    140: (Cause.HARDWARE, None, "uncorrectable GPU memory errors the driver could not retire"),
    147: (Cause.DRIVER, None, "every row of NVIDIA's 144-150 decode sheet for it is software, non-fatal"),
    148: (Cause.DRIVER, None, "every row of NVIDIA's 144-150 decode sheet for it is software, non-fatal"),
    156: (Cause.HARDWARE, None, "a failing GPU resource retired, as row remapping (63) does for memory"),
    157: (Cause.HARDWARE, None, "NVIDIA: no repair possible for lack of spare resources"),
    162: (Cause.THERMAL_POWER, None, "power smoothing circuitry; no NVIDIA bucket, no action needed"),
    163: (Cause.THERMAL_POWER, None, "power smoothing off (NVIDIA: thermal events; no GPU reset required)"),
    164: (Cause.THERMAL_POWER, None, "power smoothing wearing out (NVIDIA: monitor power swings)"),
    165: (Cause.THERMAL_POWER, None, "power smoothing exhausted and disabled; the GPU keeps working"),
    167: (Cause.HARDWARE, Action.INSPECT, "a fatal PCIe timeout with no NVIDIA bucket: a person should look"),
    168: (
        Cause.HARDWARE,
        Action.INSPECT,
        "NVIDIA: enable ECC or reboot with a shifted WPR, a person's change",
    ),
    169: (
        None,
        Action.RESET_GPU,
        "the same internal micro-controller halt as Xid 62, whose bucket is RESET_GPU",
    ),
    171: (Cause.HARDWARE, Action.RESET_GPU, "accompanies Xid 48 (WORKFLOW_XID_48: reset the GPU)"),
    172: (Cause.HARDWARE, Action.RESET_GPU, "accompanies Xid 48 (WORKFLOW_XID_48: reset the GPU)"),
}


MACHINE_CAUSES = (Cause.HARDWARE, Cause.DRIVER, Cause.THERMAL_POWER)


def severity_for(cause: Cause, action: Action) -> str:
    """The rule, step 5: application -> info; an action that drains -> critical; the GPU, its driver or
    its power erring and asking for any action -> critical too (a contained ECC error needs only the
    job's restart, but a person should hear of failing hardware; the drain rules follow the action, not
    the severity); otherwise (no action, or an unknown cause) warning."""
    if cause is Cause.APPLICATION:
        return "info"
    if action.drains or (cause in MACHINE_CAUSES and action is not Action.NONE):
        return "critical"
    return "warning"


def derive(code: int, description: str, immediate: str, investigatory: str) -> tuple[Cause, str, Action]:
    """fleetlens's (cause, severity, action) for a row of NVIDIA's columns, by the module's one rule.

    1. A code NVIDIA marks Unused: cause unknown, action none, severity warning.
    2. The action from the immediate bucket (_ACTION_BY_BUCKET; 144-150 via _NVLINK5_DECODE_WORST).
    3. The cause from the investigatory bucket, else the immediate one (_CAUSE_BY_BUCKET), else unknown.
    4. A per-code override (_OVERRIDES) replaces the cause or the action, saying why.
    5. The severity from cause and action (`severity_for`).
    """
    if description == "Unused":
        return Cause.UNKNOWN, "warning", Action.NONE
    bucket = _NVLINK5_DECODE_WORST[code] if immediate == "WORKFLOW_NVLINK5_ERR" else immediate
    action = _ACTION_BY_BUCKET[bucket]
    cause = _CAUSE_BY_BUCKET.get(investigatory) or _CAUSE_BY_BUCKET.get(immediate) or Cause.UNKNOWN
    cause_override, action_override, _ = _OVERRIDES.get(code, (None, None, ""))
    cause = cause_override or cause
    action = action_override or action
    return cause, severity_for(cause, action), action


def _build() -> dict[int, XidInfo]:
    table: dict[int, XidInfo] = {}
    rows = [(*row, "catalog") for row in _ROWS] + [(c, m, d, "", "", "legacy") for c, m, d in _LEGACY_ROWS]
    for code, mnemonic, description, immediate, investigatory, source in rows:
        if code in table:
            raise ValueError(f"Xid {code} is listed twice")
        cause, severity, action = derive(code, description, immediate, investigatory)
        table[code] = XidInfo(
            code,
            mnemonic,
            description,
            immediate,
            investigatory,
            cause,
            severity,
            action,
            source=source,
            legacy_description=_LEGACY_MEANING.get(code, "") if description == "Unused" else "",
            override=_OVERRIDES.get(code, (None, None, ""))[2] if description != "Unused" else "",
        )
    return table


_CATALOG: dict[int, XidInfo] = _build()


def lookup(code: int) -> XidInfo:
    """The catalog's row for `code`; a code the catalog lacks gets a row saying it is unknown."""
    info = _CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code,
        "UNKNOWN",
        f"Xid {code} is not in {CATALOG_SOURCE}",
        "UNKNOWN",
        "UNKNOWN",
        Cause.UNKNOWN,
        "warning",
        Action.NONE,
        documented=False,
        source="none",
    )


def worst_action(codes: Iterable[int]) -> Action:
    """The most disruptive action any of `codes` asks for (NONE for no codes)."""
    return max((lookup(code).action for code in codes), key=lambda action: action.rank, default=Action.NONE)


def catalog() -> tuple[XidInfo, ...]:
    """Every documented row, by code."""
    return tuple(_CATALOG[code] for code in sorted(_CATALOG))


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "—"


def markdown() -> str:
    """The generated part of docs/xid-catalog.md: the counts, the rule's tables, the overrides, every row."""
    rows = catalog()
    from_catalog = sum(row.source == "catalog" for row in rows)
    from_legacy = sum(row.source == "legacy" for row in rows)
    unused = sum(row.unused for row in rows)
    lines = [
        f"NVIDIA documents {len(_ROWS) + len(_LEGACY_ROWS)} Xid codes: {len(_ROWS)} in the catalog "
        f"({unused} of them marked Unused) and {len(_LEGACY_ROWS)} more only in the older documentation. "
        f"The table has {len(rows)} rows ({from_catalog} from the catalog, {from_legacy} legacy).",
        "",
        "Immediate bucket -> action:",
        "",
        "| NVIDIA immediate bucket | fleetlens action |",
        "|---|---|",
        *(
            f"| {_cell(bucket) if bucket else '(none given)'} | {action} |"
            for bucket, action in _ACTION_BY_BUCKET.items()
        ),
        "",
        "WORKFLOW_NVLINK5_ERR, by code (the most severe immediate action of NVIDIA's 144-150 decode sheet):",
        "",
        "| code | bucket | fleetlens action |",
        "|---|---|---|",
        *(
            f"| {code} | {bucket} | {_ACTION_BY_BUCKET[bucket]} |"
            for code, bucket in _NVLINK5_DECODE_WORST.items()
        ),
        "",
        "Bucket -> cause (investigatory bucket first, then immediate; any other bucket: unknown):",
        "",
        "| NVIDIA bucket | fleetlens cause |",
        "|---|---|",
        *(f"| {_cell(bucket)} | {cause} |" for bucket, cause in _CAUSE_BY_BUCKET.items()),
        "",
        "Per-code overrides:",
        "",
        "| code | mnemonic | cause | action | why |",
        "|---|---|---|---|---|",
    ]
    for code, (cause, action, why) in sorted(_OVERRIDES.items()):
        mnemonic = _CATALOG[code].mnemonic
        lines.append(f"| {code} | {mnemonic} | {cause or '(rule)'} | {action or '(rule)'} | {_cell(why)} |")
    lines += [
        "",
        "Every row:",
        "",
        "| code | mnemonic | description | immediate | investigatory | source | cause | severity | action "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        note = f"override: {row.override}" if row.override else ""
        if row.legacy_description:
            note = f"older GPUs: {row.legacy_description}"
        cells = (
            str(row.code),
            _cell(row.mnemonic),
            _cell(row.description),
            _cell(row.immediate),
            _cell(row.investigatory),
            row.source,
            row.cause,
            row.severity,
            row.action,
            _cell(note),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analytics.xid_catalog", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the generated part of docs/xid-catalog.md"
    )
    args = parser.parse_args(argv)
    if not args.markdown:
        parser.print_help()
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
