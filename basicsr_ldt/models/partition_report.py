"""The partition as users look at it: ``ldt_partition.json`` and the per-layer picture.

The picture is the paper's Figure 2a for one run, with what the run does with each layer beside
it: on top every layer's statistic in network order (the quantity the split ranks, eq. 1-2), below
the EMA coefficient W its frozen copy absorbs with (DPU, eq. 9-10; one W per group without DPU),
both coloured by group and sharing the layer axis. One sees where in the network the unstable
layers are, that W rises with the statistic inside each group, and which layers a force pattern,
not their statistic, put into their group (hatched).
"""
import os
from typing import Any, List, Optional

from basicsr_ldt.ldt import STABLE, UNSTABLE, Partition

#: Bar colour of each group, in both panels.
GROUP_COLOURS = {STABLE: 'tab:blue', UNSTABLE: 'tab:red'}
#: Hatch of the bars of forced layers, in both panels.
FORCED_HATCH = '////'


def write_partition_report(partition: Partition, folder: str, exchanged: bool = True) -> None:
    """Write ``ldt_partition.json`` and ``ldt_partition.png`` into ``folder`` (``exchanged`` False: a
    run without EMA exchange, whose picture says its coefficients are unused)."""
    partition.save(os.path.join(folder, 'ldt_partition.json'))
    figure = partition_figure(partition, exchanged)
    if figure is None:
        return  # name-based partitions (DeFT) have no statistic to plot
    from matplotlib import pyplot as plt

    target = os.path.join(folder, 'ldt_partition.png')
    figure.savefig(target + '.tmp.png', dpi=100)
    plt.close(figure)
    os.replace(target + '.tmp.png', target)


def partition_figure(partition: Partition, exchanged: bool = True) -> Optional[Any]:
    """The figure of ``ldt_partition.png`` (a matplotlib Figure, two axes), or None without statistics.

    Top: the statistic per layer (log scale); bottom: the partition's coefficient per layer, which
    is the W the run uses (after any ``ema_reference_iters`` rescaling, since the model reports the
    scaled partition). The bottom axis is cut just below the smallest W, as the paper's W differ
    only in the third decimal. The caller closes the figure.
    """
    values = [r.statistic for r in partition.layers]
    if any(v is None for v in values):
        return None
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    layers = partition.layers
    coefficients = [r.coefficient for r in layers]
    colours = [GROUP_COLOURS[r.group] for r in layers]
    hatches = [FORCED_HATCH if r.forced else '' for r in layers]
    figure, (statistic_axis, coefficient_axis) = plt.subplots(
        2, 1, sharex=True, figsize=(max(6.0, len(layers) * 0.06), 5.6), layout='constrained')
    for axis, heights in ((statistic_axis, [max(v, 1e-30) for v in values]),
                          (coefficient_axis, coefficients)):
        bars = axis.bar(range(len(layers)), heights, color=colours, width=1.0, edgecolor='black', linewidth=0)
        for bar, hatch in zip(bars, hatches):
            if hatch:
                bar.set_hatch(hatch)
                bar.set_linewidth(0.6)
    statistic_axis.set_yscale('log')
    statistic_axis.set_ylabel(f'gradient {partition.criterion}')
    forced = f', {len(partition.forced)} forced' if partition.forced else ''
    statistic_axis.set_title(f'LDT partition: {len(partition.stable)} stable (blue), '
                             f'{len(partition.unstable)} unstable (red){forced}')

    low = min(coefficients)
    coefficient_axis.set_ylim(max(0.0, low - 0.15 * max(1.0 - low, 1e-3)), 1.0)
    coefficient_axis.set_ylabel('EMA coefficient W')
    coefficient_axis.set_title(('W the run uses: ' if exchanged else "W, unused (mode 'partial'): ") + '; '.join(
        f'{group} {_span(partition.coefficients(group))}' for group in GROUP_COLOURS), fontsize='medium')
    coefficient_axis.set_xlabel('layer (parameter tensor, network order)')
    handles = _legend(partition, Patch)
    figure.legend(handles=handles, loc='outside lower center', ncol=len(handles), fontsize='small', frameon=False)
    return figure


def _span(values: List[float]) -> str:
    """``low .. high``, or the one value a group has without DPU."""
    low, high = min(values), max(values)
    return f'{low:.6g}' if low == high else f'{low:.6g} .. {high:.6g}'


def _legend(partition: Partition, patch: Any) -> List[Any]:
    """One entry per group, and one for the forced layers when there are any."""
    handles = [patch(facecolor=colour, label=group) for group, colour in GROUP_COLOURS.items()]
    if partition.forced:
        handles.append(patch(facecolor='white', edgecolor='black', hatch=FORCED_HATCH,
                             label='forced (ldt.force_stable / force_unstable)'))
    return handles
