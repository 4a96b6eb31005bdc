"""Trainer callbacks: runwatch events from Hugging Face and Lightning training loops.

Each callback lives in its own module so that importing one never imports the other
library (they are optional extras)::

    pip install 'runwatch[hf]'         # producers.callbacks.hf.RunwatchTrainerCallback
    pip install 'runwatch[lightning]'  # producers.callbacks.lightning.RunwatchLightningCallback

Both delegate to `producers.callbacks.reporter.TrainerReporter`, which knows nothing about
either library: the callbacks only translate the library's hooks and state into its calls.
"""
