"""What the entry points run: ``train`` behind ``Train_pip.py``, ``evaluate`` behind ``test.py``,
``upscale`` behind ``inference.py``. The root scripts stay a few lines around these."""
