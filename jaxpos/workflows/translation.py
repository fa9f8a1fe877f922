"""Translation as `jaxpos train` runs it, and what `translate` and `eval-bleu` do with a trained workdir."""

from __future__ import annotations

import dataclasses
from typing import Iterable

import jax
from etils import epath

from jaxpos.config.files import write_run_file, write_run_report
from jaxpos.config.run import RunConfig
from jaxpos.data.translation import build_translation_data, eval_batches, load_eval_set
from jaxpos.decoding.bleu import BleuResult, corpus_bleu
from jaxpos.decoding.translate import Translator, read_sentences
from jaxpos.models import EncoderDecoder
from jaxpos.progress import status
from jaxpos.run import Run
from jaxpos.training.loop import Trainer
from jaxpos.training.translation import TranslationTask
from jaxpos.workflows.workdir import started_run


def _loss_batches(data, tcfg):
    """Dev batches for the loss: the `index` column only serves decoding."""
    for batch in eval_batches(data.dev, tcfg.batch_size, tcfg.eval_batches, jax.process_index(),
                              jax.process_count()):
        yield {k: v for k, v in batch.items() if k != "index"}


def _setup(run: RunConfig, workdir: str):
    """(data, the run config as the run keeps it, task) for a translation run; the model's vocabulary follows the
    tokenizer."""
    data = build_translation_data(run.data, run.train.batch_size, workdir)
    run = run.replace_model(vocab_size=data.tokenizer.vocab_size)
    cfg = run.model
    # The longest sources and targets the run will see, traced now: a mechanism whose tables are too short raises
    # its own LengthError at start-up rather than at the first evaluation or at the final decoding.
    longest = max(run.data.max_length, run.data.eval_max_length)
    jax.eval_shape(EncoderDecoder(cfg).init, jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, longest), "int32"),
                   jax.ShapeDtypeStruct((1, max(longest, run.decode.target_width)), "int32"))
    task = TranslationTask(EncoderDecoder(cfg), run.data.max_length, run.data.max_length, run.train.label_smoothing)
    return data, run, task


def train_translation(config, workdir: str):
    """Trains an encoder-decoder as configured (resuming from WORKDIR), reports dev loss and BLEU along the way,
    then test BLEU with beam search against the copy-the-source baseline (train.test_bleu, capped at
    train.test_sentences). Returns the report dict. A refused run leaves WORKDIR as it was; SIGTERM or SIGINT
    checkpoints and raises RunStopped (jaxpos.training.interrupt)."""
    with started_run(config, "translation", workdir) as (run, admission):  # checked once, before any data is read
        return _train_translation(run, workdir, admission)


def _train_translation(run: RunConfig, workdir: str, admission):
    tcfg = run.train
    status(f"jaxpos: translation, position={run.model.position.kind}, devices={jax.device_count()}x"
           f"{jax.devices()[0].device_kind}, workdir={workdir}")
    data, run, task = _setup(run, workdir)
    cfg, dcfg = run.model, run.decode
    status(data.summary())
    # Refuses a checkpoint of another model and a batch the mesh cannot split.
    trainer = Trainer(tcfg, workdir, task, mesh=run.mesh)

    has_dev = len(data.dev) > 0
    if not has_dev:
        status("no dev split: training without dev loss or dev BLEU")

    def bleu_hook(step, state):
        if not has_dev or not tcfg.bleu_every or step % tcfg.bleu_every:
            return None
        translator = Translator(cfg, state.params, data.tokenizer, dcfg, data.dev.inputs.shape[1])
        return {"bleu": translator.evaluate(data.dev, tcfg.bleu_sentences)[0].score}

    try:
        result = trainer.run(data.train, eval_batches=(lambda: _loss_batches(data, tcfg)) if has_dev else None,
                             hooks=[bleu_hook], on_start=lambda: admission.admit(run))
    finally:
        trainer.close()
    params = result.state.params
    report = dict(step=int(jax.device_get(result.state.step)), train=result.final_metrics,
                  dev=result.eval_metrics, position=cfg.position.kind)
    if len(data.test) and tcfg.test_bleu:
        translator = Translator(cfg, params, data.tokenizer, dcfg, data.test.inputs.shape[1])
        bleu, hypotheses = translator.evaluate(data.test, tcfg.test_sentences, progress=True)
        count = len(hypotheses)
        copy = corpus_bleu(data.test.sources[:count], data.test.references[:count])
        report.update(test_bleu=bleu.score, test_bleu_signature=bleu.signature, test_bleu_details=bleu.details,
                      copy_source_bleu=copy.score, test_sentences=count)
        if jax.process_index() == 0:
            write_run_file(workdir, "test_translations.txt", "".join(h + "\n" for h in hypotheses))
        status(f"test SacreBLEU {bleu.score:.2f} ({bleu.details}; {bleu.signature}) on {count} of "
               f"{len(data.test)} sentences; copying the source scores {copy.score:.2f}")
    elif len(data.test):
        status(f"no test BLEU (train.test_bleu=False): jaxpos eval-bleu --workdir {workdir} decodes the test split")
    if jax.process_index() == 0:
        report = write_run_report(workdir, report)
    status(f"checkpoints: {epath.Path(workdir) / 'checkpoints'}  TensorBoard: {epath.Path(workdir) / 'tensorboard'}"
           f"  report: {epath.Path(workdir) / 'report.json'}")
    return report


def load_translator(workdir: str, overrides: list[str] = ()):
    """(Translator with the newest restorable checkpoint's parameters, the run's config, checkpoint step) of a
    translation workdir (local or a URL); reads no training data."""
    run = Run.open(workdir, "translation", overrides)
    tokenizer = run.tokenizer()
    step, params = run.params(on=jax.devices()[0])
    config = run.config
    translator = Translator(run.model_config, params, tokenizer, config.decode, config.data.eval_max_length)
    return translator, config, step


@dataclasses.dataclass
class Translations:
    lines: list[str]  # one translation per input line ("" for an empty one)
    cut: int  # input lines longer than `max_source_tokens`, cut to it
    max_source_tokens: int
    step: int  # the checkpoint that translated them


def translate(workdir: str, lines: Iterable[str], overrides=(), progress: bool = False) -> Translations:
    """Translates `lines` (read once the checkpoint is loaded, e.g. a file or stdin) with the newest restorable
    checkpoint of a translation workdir; `progress` shows decoding progress."""
    translator, _, step = load_translator(workdir, overrides)
    outputs, cut = translator.translate(read_sentences(lines), progress=progress)
    return Translations(outputs, cut, translator.source_width - 1, step)


@dataclasses.dataclass
class BleuScore:
    split: str
    sentences: int  # decoded (the split's first ones)
    step: int
    beam_size: int
    alpha: float
    bleu: BleuResult
    copy_source: float  # SacreBLEU of the sources themselves as translations


def eval_bleu(workdir: str, split: str = "test", max_sentences: int = 0, overrides=()) -> BleuScore:
    """SacreBLEU (with its signature) of the newest checkpoint's beam search on a held-out split of the run's data
    (its first `max_sentences`; 0 = all), and of copying the source."""
    translator, config, step = load_translator(workdir, overrides)
    eval_set, _ = load_eval_set(config.data, split, translator.tokenizer)
    if not len(eval_set):
        raise ValueError(f"the {split!r} split of {workdir}'s data is empty")
    bleu, hypotheses = translator.evaluate(eval_set, max_sentences, progress=True)
    count = len(hypotheses)
    copy = corpus_bleu(eval_set.sources[:count], eval_set.references[:count])
    return BleuScore(split, count, step, translator.dcfg.beam_size, translator.dcfg.alpha, bleu, copy.score)
