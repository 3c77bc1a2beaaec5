"""The fleet simulator: scenarios of faults and confounders played through the real exporter and hub.

scenario    the scenario format (YAML), validated
sysfs       a node's generated /sys tree
fleet       simulated nodes served on loopback by a real exporter each
jobs        training jobs' step records
simulator   a scenario played online (through the hub's scraper) or offline (straight into a store)
live        a scenario served on the wall clock for a separate hub (the demo's fleet)
loopserver  the asyncio HTTP server the simulated nodes answer on
evaluation  detectors scored against the injected faults
pipeline    simulate and evaluate scenarios into throwaway stores

Both modes give the same rows for a scenario (the targets' duration_s aside), and the same scenario (its
seed) in the same workdir gives identical rows run after run. Targets are named `<node>:9400`, where a
real fleet's exporter listens; the loopback ports are the simulation's. `workdir` holds the /sys trees,
NCCL logs and the online spool; put it on tmpfs for large fleets.
"""
