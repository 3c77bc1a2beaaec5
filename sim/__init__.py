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
"""
