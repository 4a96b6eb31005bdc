"""Skip the modules that need torch where it is not installed (it is an optional extra)."""

import importlib.util

collect_ignore_glob = (
    []
    if importlib.util.find_spec("torch")
    else ["test_checkpoint.py", "test_torch_helpers.py", "test_data.py"]
)
