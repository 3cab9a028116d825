"""The partition as users look at it: ``ldt_partition.json`` and the per-layer statistic plot.

The plot is the paper's Figure 2 for one run: every layer's statistic in network order, coloured
by group, so one sees where in the network the unstable layers are.
"""
import os

from basicsr_ldt.ldt import Partition


def write_partition_report(partition: Partition, folder: str) -> None:
    """Write ``ldt_partition.json`` and ``ldt_partition.png`` into ``folder``."""
    partition.save(os.path.join(folder, 'ldt_partition.json'))
    values = [r.statistic for r in partition.layers]
    if any(v is None for v in values):
        return  # name-based partitions (DeFT) have no statistic to plot
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt

    colours = ['tab:red' if r.group == 'unstable' else 'tab:blue' for r in partition.layers]
    figure, axis = plt.subplots(figsize=(max(6.0, len(values) * 0.06), 3.2))
    axis.bar(range(len(values)), [max(v, 1e-30) for v in values], color=colours, width=1.0)
    axis.set_yscale('log')
    axis.set_xlabel('layer (parameter tensor, network order)')
    axis.set_ylabel(f'gradient {partition.criterion}')
    axis.set_title(f'LDT partition: {len(partition.stable)} stable (blue), {len(partition.unstable)} unstable (red)')
    figure.tight_layout()
    target = os.path.join(folder, 'ldt_partition.png')
    figure.savefig(target + '.tmp.png', dpi=100)
    plt.close(figure)
    os.replace(target + '.tmp.png', target)
