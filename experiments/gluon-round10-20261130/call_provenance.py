"""Round 10: a provenance.json in each call folder, beside its data, made from the folder's own
provenance.json (the overview of all calls): GPU, driver, versions, the call's commit, seeds,
command and device seconds, and for each table made afterwards on the CPU, how it was made."""
import json
from pathlib import Path

here = Path(__file__).resolve().parents[1]
overview = json.loads((here / "provenance.json").read_text())
CARRIED_DEEP_GEMM = {"call1", "call2", "call3", "call4"}  # calls 5 and 6 carried only .scratch/r11
DERIVED = {
    "call1": {
        "stalls.csv": "python code/stall_table.py call1/stalls.csv ncu-shipped-n1-sass.csv ncu-shipped-n2-sass.csv, "
        "the CSVs from `ncu -i call1/ncu-shipped-nN.ncu-rep --page source --csv --print-source sass`",
        "ncu-shipped-n1-details.csv": "ncu -i call1/ncu-shipped-n1.ncu-rep --page details --csv (on the device)",
        "ncu-shipped-n2-details.csv": "ncu -i call1/ncu-shipped-n2.ncu-rep --page details --csv (on the device)",
    },
    "call5": {"b1_steps.csv": "python code/timeline_table.py call5", "n3_consumers.csv": "python code/timeline_table.py call5"},
    "call6": {"b1_steps.csv": "python code/timeline_table.py call6"},
}


def git_of(call: str) -> dict:
    """The call's commit, its note with 'as callK' replaced by callK's own note."""
    git = dict(overview["git"]["calls"][call])
    note = git.get("note", "")
    if note.startswith("as call"):
        earlier, _, rest = note.partition(";")
        git["note"] = git_of(earlier.removeprefix("as ").strip())["note"] + (";" + rest if rest else "")
    return git


for call in overview["command"]:
    environment = {k: v for k, v in overview["environment"].items()
                   if (k != "deep_gemm" or call in CARRIED_DEEP_GEMM) and (k != "ncu" or call == "call1")}
    provenance = {
        **{k: overview[k] for k in ("schema_version", "source", "device", "device_name", "created", "seed",
                                    "timing_method")},
        "run_id": f"{overview['run_id']}/{call}",
        "kind": f"{overview['kind']}-call",
        "environment": environment,
        "git": {**git_of(call), "variant_kernels": overview["git"]["variant_kernels"]},
        "command": overview["command"][call],
        "device_seconds": overview["device_seconds"][call],
        "derived_on_cpu": DERIVED.get(call, {}),
        "overview": "../provenance.json and ../README.md",
    }
    (here / call / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
