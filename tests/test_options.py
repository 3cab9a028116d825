"""Every shipped option file passes the check the entry points run (basicsr_ldt.common.schema), so a
key the code stops reading (and the schema drops) is found at once; the schema's key lists agree
with the modules that read the keys, and docs/options.md explains every key."""
import re
from pathlib import Path

import pytest

from basicsr.utils.registry import MODEL_REGISTRY

from basicsr_ldt.common import schema
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.option_file import read_checked_options
from basicsr_ldt.models.corgrad_model import corgrad_config_from_options
from basicsr_ldt.models.ldt_model import ldt_config_from_options

REPO = Path(__file__).resolve().parents[1]
# Study files (options/study/) are checked by their own --dry-run tests in test_study.py.
OPTIONS = sorted(p for p in (REPO / 'options').rglob('*.yml') if p.parent.name != 'study')


@pytest.mark.parametrize('path', OPTIONS, ids=[p.name for p in OPTIONS])
def test_option_file_is_valid(path):
    role = schema.TEST if path.name.startswith('test') else schema.TRAIN
    opt, defaults = read_checked_options(str(path), role)
    assert defaults is None, f'{path.name} leaves out {defaults}: shipped files write every key they use'
    if path.name.startswith('train') or path.name.startswith('pretrain'):
        assert opt['model_type'] in MODEL_REGISTRY
        assert set(opt['datasets']) - {'train'} and all(k == 'train' or k.startswith('val') for k in opt['datasets'])
    if opt.get('model_type') == 'LDTSRModel':
        corgrad = (opt.get('ldt') or {}).get('method') == 'corgrad'
        (corgrad_config_from_options if corgrad else ldt_config_from_options)(opt)


def test_ldt_section_errors_are_one_line():
    base = {'train': {'total_iter': 100}}
    with pytest.raises(InputError, match="^ldt: unknown LDT option 'ratio'; did you mean 'ratio_u'"):
        ldt_config_from_options({**base, 'ldt': {'ratio': 0.5}})
    with pytest.raises(InputError, match=r"^ldt\.ratio_u: expected a number in \(0, 1\), got 1\.0$"):
        ldt_config_from_options({**base, 'ldt': {'ratio_u': 1.0}})
    with pytest.raises(InputError, match=r'head_warmup_iters \(50\) \+ profile_iters \(60\) must be smaller'):
        ldt_config_from_options({**base, 'ldt': {'head_warmup_iters': 50, 'profile_iters': 60}})
    with pytest.raises(InputError, match=r'head_warmup_iters \(0\) \+ profile_iters \(100\) must be smaller'):
        ldt_config_from_options({**base, 'ldt': {'profile_iters': 100}})     # nothing left to train
    with pytest.raises(InputError, match=r'^ldt\.ema_every: a run of 100 iterations leaves 99 training iterations'):
        ldt_config_from_options({**base, 'ldt': {'profile_iters': 1, 'criterion': 'random', 'ema_every': 200}})
    with pytest.raises(InputError, match="ldt.method: expected one of 'ft', .*'corgrad', got 'dft'.*did you mean 'deft'"):
        ldt_config_from_options({**base, 'ldt': {'method': 'dft'}})


def test_a_learning_rate_warm_up_reaching_into_profiling_is_refused():
    """Audit 6: BasicSR ramps the rate at iterations 1 .. warmup_iter - 1 on the optimizers that exist, and LDT's
    profiling iterations have none: warmup_iter 3 over 2 profiling iterations trained exactly as without it."""
    def config(warmup, **ldt):
        return ldt_config_from_options({'train': {'total_iter': 100, 'warmup_iter': warmup},
                                        'ldt': {'profile_iters': 2, 'ema_every': 1, **ldt}})
    with pytest.raises(InputError, match=r'^train\.warmup_iter: 3 ramps the rate up to iteration 2, and iterations 1-2 '
                                         r'profile gradients without an optimizer step, .*; expected -1 \(no warm-up\)$'):
        config(3)
    with pytest.raises(InputError, match=r'^train\.warmup_iter: 2 ramps the rate up to iteration 1, '):
        config(2)
    with pytest.raises(InputError, match=r'iterations 6-7 profile .*expected -1 \(no warm-up\) or at most 6 \(the head '
                                         r'warm-up alone\)$'):
        config(8, head_warmup_iters=5)
    assert config(6, head_warmup_iters=5) and config(-1) and config(0) and config(1)   # the head warm-up's ramp
    assert ldt_config_from_options({'train': {'total_iter': 100, 'warmup_iter': 50}, 'ldt': {'method': 'ft'}})


def test_random_draws_follow_manual_seed_unless_given():
    """A study's seeds are replicates: each must draw its own random partition (criterion 'random') and
    CorGrad camera orders, as each draws its own crops; with one fixed ldt.seed every seed of a random
    control shared one partition. A seed written in the file wins; a run that draws nothing keeps 0, so
    its saved LDT state resumes as before."""
    base = {'train': {'total_iter': 1000}}
    random = {'method': 'ldt_random'}
    assert [ldt_config_from_options({**base, 'manual_seed': s, 'ldt': random}).seed for s in (0, 1, 2)] == [0, 1, 2]
    assert ldt_config_from_options({**base, 'manual_seed': 5, 'ldt': {**random, 'seed': 2}}).seed == 2
    assert ldt_config_from_options({**base, 'manual_seed': 5, 'ldt': {'method': 'ldt'}}).seed == 0
    assert ldt_config_from_options({**base, 'ldt': random}).seed == 0
    corgrad = {'method': 'corgrad'}
    assert corgrad_config_from_options({**base, 'manual_seed': 4, 'ldt': corgrad})[0].seed == 4
    assert corgrad_config_from_options({**base, 'manual_seed': 4, 'ldt': {**corgrad, 'seed': 1}})[0].seed == 1


def test_the_schema_agrees_with_the_modules_that_read_the_keys():
    """Key lists that modules keep with their defaults are the schema's (one place decides)."""
    from basicsr_ldt.inference.compare import COMPARE_DEFAULTS  # noqa: F401  (test.compare: its own keys)
    from basicsr_ldt.inference.settings import INFERENCE_DEFAULTS
    from basicsr_ldt.models.compiled_blocks import COMPILE_DEFAULTS
    from basicsr_ldt.models.guarded_step import STEP_DEFAULTS
    from basicsr_ldt.models.validation import BASICSR_VAL_SPECS, VAL_KEYS
    from basicsr_ldt.pipelines.evaluate import TEST_DEFAULTS, TEST_SPECS
    assert tuple(INFERENCE_DEFAULTS) == schema.INFERENCE_KEYS
    assert set(TEST_DEFAULTS) == set(schema.TEST_KEYS) and set(TEST_SPECS) - {'compare.crops', 'compare.size',
                                                                              'compare.methods'} == set(TEST_DEFAULTS)
    assert set(COMPILE_DEFAULTS) | set(STEP_DEFAULTS) <= {k for k, e in schema.TRAIN_KEYS.items()
                                                          if e.models == schema.PROJECT_MODELS}
    assert set(BASICSR_VAL_SPECS) <= set(VAL_KEYS) and set(VAL_KEYS) == set(schema.VAL_KEYS)
    assert set(schema.MODEL_TYPES) <= {name for name, _ in MODEL_REGISTRY}


def test_docs_explain_every_key_of_the_schema():
    """docs/options.md names each key the schema accepts (in backticks), section by section."""
    text = (REPO / 'docs' / 'options.md').read_text()
    named = set(re.findall(r'`([A-Za-z_][A-Za-z0-9_.]*)`', text))
    missing = [f'{path}.{key}' if path else key for path, section in schema.SECTIONS.items()
               for key, entry in section.items() if entry.set_by is None and key not in named
               and f'{path}.{key}' not in named]
    loader = {k for keys in schema.DATASET_LOADER.values() for k in keys}
    missing += sorted(k for k in loader | set(schema.DATASET_COMMON) if k not in named)
    assert not missing, f'docs/options.md does not explain: {", ".join(missing)}'
    assert len(text.splitlines()) < 300


def test_a_warm_up_before_a_multi_step_schedule_says_the_rate_it_leaves():
    """Audit 6: BasicSR's MultiStepRestartLR keeps the last warm-up rate, so warmup_iter 3 trained at 2/3 of lr for
    the whole run while the file said lr; the log says so (upstream's behaviour is kept: runs compare with its)."""
    from basicsr_ldt.models.option_values import warm_up_rate_warning

    def warning(warmup, kind='MultiStepLR'):
        return warm_up_rate_warning({'train': {'warmup_iter': warmup, 'optim_g': {'lr': 3e-4},
                                               'scheduler': {'type': kind}}})
    assert warning(3) == ('train.warmup_iter 3 with MultiStepLR: after the warm-up the rate stays at 2/3 of '
                          'train.optim_g.lr (0.0002 instead of 0.0003; milestones scale that), as in BasicSR; '
                          'CosineAnnealingRestartLR reaches lr')
    assert warning(1000, 'MultiStepRestartLR').startswith('train.warmup_iter 1000 with MultiStepRestartLR: ')
    assert warning(2).startswith('train.warmup_iter 2 with MultiStepLR: after the warm-up the rate stays at 1/2 of ')
    assert warning(1) is warning(-1) is warning(3, 'CosineAnnealingRestartLR') is None
