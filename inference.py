"""Super-resolve your own images: ``python inference.py --input DIR --output DIR --checkpoint X.pth --arch SAFMN``.

``python inference.py -h`` lists every flag; the logic is ``basicsr_ldt/pipelines/upscale.py``.
"""
import basicsr_ldt  # noqa: F401  (registers archs; must precede basicsr)
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.outputs import fail
from basicsr_ldt.pipelines.upscale import main

if __name__ == '__main__':
    try:
        raise SystemExit(main())
    except InputError as err:
        fail(str(err))
