"""GPUs and memory: NVML readings, the resource monitor, the VRAM estimate and plan, out-of-memory recognition."""
