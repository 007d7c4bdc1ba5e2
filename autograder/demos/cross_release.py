"""Notebook 09's cross-release demo: one tiny DCP checkpoint, byte for byte as two PyTorch releases wrote it.

torch 2.13.0 (the CPU build) and torch 2.15.0 (pip's default build, CUDA 13.2, run on the CPU) each ran,
in one process, in an empty folder:

    dcp.save({"model": {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3)}}, checkpoint_id="step_8")

``WRITTEN`` holds the files of ``step_8`` each left (base64). 2.15's ``.metadata`` records each tensor's
strides, a sixth field that 2.13's and 2.14's DCP do not unpack; the shard files are the same bytes.
The notebook writes the folders back and shows what the installed release makes of each
(``tests/notebooks/test_09_sharded_checkpoints.py`` asserts the same on the release it runs on).
"""

from __future__ import annotations

import base64
from pathlib import Path

RELEASE_FILE = "torch_version"   # beside .metadata: the release that wrote the folder, readable without DCP

_SHARD = (
    'UEsDBAAACAgAAAAAAAAAAAAAAAAAAAAAAAAQABIAYXJjaGl2ZS9kYXRhLnBrbEZCDgBaWlpaWlpaWlpaWlpaWoACY3RvcmNoLl91'
    'dGlscwpfcmVidWlsZF90ZW5zb3JfdjIKcQAoKFgHAAAAc3RvcmFnZXEBY3RvcmNoCkZsb2F0U3RvcmFnZQpxAlgBAAAAMHEDWAMA'
    'AABjcHVxBEsGdHEFUUsASwJLA4ZxBksDSwGGcQeJY2NvbGxlY3Rpb25zCk9yZGVyZWREaWN0CnEIKVJxCXRxClJxCy5QSwcIx3NT'
    'J5oAAACaAAAAUEsDBAAACAgAAAAAAAAAAAAAAAAAAAAAAAAXACEAYXJjaGl2ZS8uZm9ybWF0X3ZlcnNpb25GQh0AWlpaWlpaWlpa'
    'WlpaWlpaWlpaWlpaWlpaWlpaWloxUEsHCLfv3IMBAAAAAQAAAFBLAwQAAAgIAAAAAAAAAAAAAAAAAAAAAAAAGgA3AGFyY2hpdmUv'
    'LnN0b3JhZ2VfYWxpZ25tZW50RkIzAFpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWjY0'
    'UEsHCD93cekCAAAAAgAAAFBLAwQAAAgIAAAAAAAAAAAAAAAAAAAAAAAAEQA/AGFyY2hpdmUvYnl0ZW9yZGVyRkI7AFpaWlpaWlpa'
    'WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpabGl0dGxlUEsHCIU94xkGAAAABgAAAFBL'
    'AwQAAAgIAAAAAAAAAAAAAAAAAAAAAAAADgA+AGFyY2hpdmUvZGF0YS8wRkI6AFpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpa'
    'WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWloAAAAAAACAPwAAAEAAAEBAAACAQAAAoEBQSwcIF5DnkRgAAAAYAAAAUEsDBAAA'
    'CAgAAAAAAAAAAAAAAAAAAAAAAAAPACsAYXJjaGl2ZS92ZXJzaW9uRkInAFpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpa'
    'WlpaWlpaWjMKUEsHCNGeZ1UCAAAAAgAAAFBLAwQAAAgIAAAAAAAAAAAAAAAAAAAAAAAAHgAyAGFyY2hpdmUvLmRhdGEvc2VyaWFs'
    'aXphdGlvbl9pZEZCLgBaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaMTU3MjgxOTk1MTE4NTQ2'
    'NDMwMjYwMzYyMjQzMDExNTg3MjEyNjY1NFBLBwgqSdUiKAAAACgAAABQSwECAAAAAAgIAAAAAAAAx3NTJ5oAAACaAAAAEAAAAAAA'
    'AAAAAAAAAAAAAAAAYXJjaGl2ZS9kYXRhLnBrbFBLAQIAAAAACAgAAAAAAAC379yDAQAAAAEAAAAXAAAAAAAAAAAAAAAAAOoAAABh'
    'cmNoaXZlLy5mb3JtYXRfdmVyc2lvblBLAQIAAAAACAgAAAAAAAA/d3HpAgAAAAIAAAAaAAAAAAAAAAAAAAAAAFEBAABhcmNoaXZl'
    'Ly5zdG9yYWdlX2FsaWdubWVudFBLAQIAAAAACAgAAAAAAACFPeMZBgAAAAYAAAARAAAAAAAAAAAAAAAAANIBAABhcmNoaXZlL2J5'
    'dGVvcmRlclBLAQIAAAAACAgAAAAAAAAXkOeRGAAAABgAAAAOAAAAAAAAAAAAAAAAAFYCAABhcmNoaXZlL2RhdGEvMFBLAQIAAAAA'
    'CAgAAAAAAADRnmdVAgAAAAIAAAAPAAAAAAAAAAAAAAAAAOgCAABhcmNoaXZlL3ZlcnNpb25QSwECAAAAAAgIAAAAAAAAKknVIigA'
    'AAAoAAAAHgAAAAAAAAAAAAAAAABSAwAAYXJjaGl2ZS8uZGF0YS9zZXJpYWxpemF0aW9uX2lkUEsGBiwAAAAAAAAAHgMtAAAAAAAA'
    'AAAABwAAAAAAAAAHAAAAAAAAAM8BAAAAAAAA+AMAAAAAAABQSwYHAAAAAMcFAAAAAAAAAQAAAFBLBQYAAAAABwAHAM8BAAD4AwAA'
    'AAA=')

WRITTEN = {
    "2.13.0": {".metadata": (
        'gASVRwMAAAAAAACMJXRvcmNoLmRpc3RyaWJ1dGVkLmNoZWNrcG9pbnQubWV0YWRhdGGUjAhNZXRhZGF0YZSTlCmBlH2UKIwTc3Rh'
        'dGVfZGljdF9tZXRhZGF0YZR9lIwMbW9kZWwud2VpZ2h0lGgAjBVUZW5zb3JTdG9yYWdlTWV0YWRhdGGUk5QpgZR9lCiMCnByb3Bl'
        'cnRpZXOUaACMEFRlbnNvclByb3BlcnRpZXOUk5QpgZQojAV0b3JjaJSMB2Zsb2F0MzKUk5SME3RvcmNoLnNlcmlhbGl6YXRpb26U'
        'jAtfZ2V0X2xheW91dJSTlIwNdG9yY2guc3RyaWRlZJSFlFKUiWgAjBRfTUVNX0ZPUk1BVF9FTkNPRElOR5STlEsAhZRSlIl0lGKM'
        'BHNpemWUjAV0b3JjaJSMBFNpemWUk5RLAksDhpSFlFKUjAZjaHVua3OUXZRoAIwUQ2h1bmtTdG9yYWdlTWV0YWRhdGGUk5QpgZR9'
        'lCiMB29mZnNldHOUaCFLAEsAhpSFlFKUjAVzaXplc5RoIUsCSwOGlIWUUpR1YmF1YnOMDHBsYW5uZXJfZGF0YZR9lGgHjAVtb2Rl'
        'bJSMBndlaWdodJSGlHOMDHN0b3JhZ2VfZGF0YZR9lGgAjA1NZXRhZGF0YUluZGV4lJOUKYGUfZQojANmcW6UaAeMBWluZGV4lEsA'
        'jAZvZmZzZXSUaCFLAEsAhpSFlFKUdWKMJ3RvcmNoLmRpc3RyaWJ1dGVkLmNoZWNrcG9pbnQuZmlsZXN5c3RlbZSMDF9TdG9yYWdl'
        'SW5mb5STlCmBlH2UKIwNcmVsYXRpdmVfcGF0aJSMDF9fMF8wLmRpc3RjcJRoQEsAjAZsZW5ndGiUTSkGdWJzjAxzdG9yYWdlX21l'
        'dGGUaACMC1N0b3JhZ2VNZXRhlJOUKYGUfZQojA1jaGVja3BvaW50X2lklIwHcGF0aGxpYpSMCVBvc2l4UGF0aJSTlIwGc3RlcF84'
        'lIWUUpSMB3NhdmVfaWSUjCQ2ODg4MWUzZS01ZDI3LTRhYzYtOTE4Yy1iN2M3ZjBlOGFlODWUjAdsb2FkX2lklE6MB21vZHVsZXOU'
        'XZR1YowHdmVyc2lvbpSMBTEuMC4wlHViLg=='), "__0_0.distcp": _SHARD},
    "2.15.0": {".metadata": (
        'gASVTQMAAAAAAACMJXRvcmNoLmRpc3RyaWJ1dGVkLmNoZWNrcG9pbnQubWV0YWRhdGGUjAhNZXRhZGF0YZSTlCmBlH2UKIwTc3Rh'
        'dGVfZGljdF9tZXRhZGF0YZR9lIwMbW9kZWwud2VpZ2h0lGgAjBVUZW5zb3JTdG9yYWdlTWV0YWRhdGGUk5QpgZR9lCiMCnByb3Bl'
        'cnRpZXOUaACMEFRlbnNvclByb3BlcnRpZXOUk5QpgZQojAV0b3JjaJSMB2Zsb2F0MzKUk5SME3RvcmNoLnNlcmlhbGl6YXRpb26U'
        'jAtfZ2V0X2xheW91dJSTlIwNdG9yY2guc3RyaWRlZJSFlFKUiWgAjBRfTUVNX0ZPUk1BVF9FTkNPRElOR5STlEsAhZRSlIlLA0sB'
        'hpR0lGKMBHNpemWUjAV0b3JjaJSMBFNpemWUk5RLAksDhpSFlFKUjAZjaHVua3OUXZRoAIwUQ2h1bmtTdG9yYWdlTWV0YWRhdGGU'
        'k5QpgZR9lCiMB29mZnNldHOUaCJLAEsAhpSFlFKUjAVzaXplc5RoIksCSwOGlIWUUpR1YmF1YnOMDHBsYW5uZXJfZGF0YZR9lGgH'
        'jAVtb2RlbJSMBndlaWdodJSGlHOMDHN0b3JhZ2VfZGF0YZR9lGgAjA1NZXRhZGF0YUluZGV4lJOUKYGUfZQojANmcW6UaAeMBWlu'
        'ZGV4lEsAjAZvZmZzZXSUaCJLAEsAhpSFlFKUdWKMJ3RvcmNoLmRpc3RyaWJ1dGVkLmNoZWNrcG9pbnQuZmlsZXN5c3RlbZSMDF9T'
        'dG9yYWdlSW5mb5STlCmBlH2UKIwNcmVsYXRpdmVfcGF0aJSMDF9fMF8wLmRpc3RjcJRoQUsAjAZsZW5ndGiUTSkGdWJzjAxzdG9y'
        'YWdlX21ldGGUaACMC1N0b3JhZ2VNZXRhlJOUKYGUfZQojA1jaGVja3BvaW50X2lklIwHcGF0aGxpYpSMCVBvc2l4UGF0aJSTlIwG'
        'c3RlcF84lIWUUpSMB3NhdmVfaWSUjCQxNzJiOWVkNC1kNWMyLTRlMjUtOWFhYi03YjE2ZDA1NzUxZTCUjAdsb2FkX2lklE6MB21v'
        'ZHVsZXOUXZR1YowHdmVyc2lvbpSMBTEuMC4wlHViLg=='), "__0_0.distcp": _SHARD},
}


def written_by(release: str, run_dir) -> Path:
    """run_dir/step_8 as torch ``release`` left it, with that release recorded in its ``torch_version``
    file, as a save that records its release writes it."""
    folder = Path(run_dir) / "step_8"
    folder.mkdir(parents=True)
    for name, data in WRITTEN[release].items():
        (folder / name).write_bytes(base64.b64decode(data))
    (folder / RELEASE_FILE).write_text(release)
    return folder
