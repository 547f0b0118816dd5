"""The node side of the fleet: find devices, plan workers that fit, start and keep them alive.

    gpus.py            GPU / MIG / CPU discovery (NVML, nvidia-smi, /proc)
    model_shape.py     a model's memory-relevant numbers (config.json or a built-in table)
    capacity.py        weights, KV cache, what fits on a device
    plan.py            placement: workers per device, their env, ports and engine settings
    worker_process.py  one worker process: its command line, start, wait until SERVING, stop with its
                       process group
    supervisor.py      starts, registers, restarts and drains the planned workers
    spark_workers.py   workers that live as long as a Spark application
"""
