#!/usr/bin/env bash
# The device checks of one lent-GPU session, in one call: calibrate and validate the harness
# on the GPU, then time the kernels the model is least sure of (validate/probe_cuda.py).
# Run from the repository root on a machine with torch and a CUDA GPU; nothing is installed:
# PYTHONPATH carries the checkout (and .pylib, typer's pure-Python stack, where the machine's
# typer is another version). Results: $OUT/results.tgz (default runs/device/).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.pylib:$PWD" MPLBACKEND=Agg
O="${OUT:-runs/device}"
W="$O/work"
mkdir -p "$W"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version \
    --format=csv > "$W/nvidia-smi.csv" 2>&1
python3 -c "import torch, typer; print('torch', torch.__version__, 'typer', typer.__version__, torch.cuda.get_device_name())" | tee "$W/versions.txt"
T0=$SECONDS
timeout "${T_CAL:-200}" python3 -m validate calibrate --device cuda --out "$W/hardware.yaml" \
    --no-progress > "$W/calibrate.log" 2>&1
echo "calibrate rc=$? $((SECONDS - T0)) s"; tail -5 "$W/calibrate.log"
T0=$SECONDS
HW="$W/hardware.yaml"; [ -f "$HW" ] || HW=h200-sxm
timeout "${T_VAL:-170}" python3 -m validate validate -H "$HW" --device cuda \
    --out "$W/validation" --passes 1 --no-progress > "$W/validate.log" 2>&1
echo "validate rc=$? $((SECONDS - T0)) s"; tail -5 "$W/validate.log"
T0=$SECONDS
timeout "${T_PROBE:-170}" python3 -m validate.probe_cuda --out "$W/probe" > "$W/probe.log" 2>&1
echo "probe rc=$? $((SECONDS - T0)) s"; tail -3 "$W/probe.log"
tar czf "$O/results.tgz" -C "$O" work && ls -la "$O/results.tgz"
