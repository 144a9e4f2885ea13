"""The stack-config contract (`kontinuum:` namespace) and its validator, with no Pulumi: the
program checks its config with it before registering anything, `python -m kontinuum check`
and `schema` use it without an engine.

schema.py         the tiny schema language (shapes, formats, JSON Schema, README table)
contract.py       the contract itself, STACK, with its defaults and value formats
flux_contract.py  the `zones[].flux` part of the contract (Flux's own formats and defaults)
model.py          the typed stack config (StackConfig, Zone, Pool, Hub, …)
parse.py          raw values → typed config, with every cross-field problem at its path
exposure.py       typed `zones[].ingress` / `zones[].dns` and their cross-field checks
flux.py           typed `zones[].flux` and its cross-field and secret checks
specs.py          zone → the core's ClusterSpec (machine-config terms), and its checks
render_check.py   every pool's machine config rendered and judged (ours, then Talos's validator)
validation.py     the whole check, and reading the values from the engine or a stack file
"""
