"""Studies: many seeded runs of several methods from one YAML file, trained, tested and compared.

``plan`` expands and validates a study file, ``run`` trains and tests each run through the entry
points, ``report`` aggregates the per-run tables into means, spreads and paired differences.
"""
