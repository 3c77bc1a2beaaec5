"""The fleet simulator: scenarios of faults and confounders played through the real exporter and hub.

scenario     the scenario format (YAML), validated
sysfs        a node's generated /sys tree
fleet        simulated nodes served on loopback by a real exporter each
jobs         training jobs' step records, with a step-time noise model calibrated on real jobs
calibration  step-time statistics of real traces and of the simulator, computed the same way
node         one simulated node: its /sys tree, GPUs, NCCL logs and jobs' steps, tick by tick
stock        the stock flavour (`exporters: stock`): what stock exporters show, and the faults they cannot
dcgm         a node's GPUs as dcgm-exporter with its default counter set serves them (stock flavour)
nodeexporter a real node_exporter process on a node's /sys tree (stock flavour)
offline      a scenario played straight into a store
online       a scenario played through the hub's scraper, writer and step receiver
live         a scenario served on the wall clock for a separate hub (the demo's fleet)
loopserver   the asyncio HTTP server the simulated nodes answer on
evaluation   detectors scored against the injected faults
pipeline     simulate and evaluate scenarios into throwaway stores
errors       the errors the simulator raises, as one tree (SimError)

Both modes give the same rows for a scenario (the targets' duration_s aside), and the same scenario (its
seed) in the same workdir gives identical rows run after run. Targets are named `<node>:9612`, where a
real fleet's exporter listens; the loopback ports are the simulation's. `workdir` holds the /sys trees,
NCCL logs and the online spool; put it on tmpfs for large fleets.
"""
