"""The tokenizer an imported model is published with: the one it was trained with, never a default.

A model folder pairs weights with a tokenizer; the pairing is only right when the tokenizer is the
one the weights were trained with. An import therefore takes, in this order: the file named by
--tokenizer; the source folder's own tokenizer.json or tokenizer.model; the --base-config's
data.tokenizer; the tokenizer the source's config.json names (the released models name
EleutherAI/gpt-neox-20b, which this repository ships). A source that names none is refused: a
guess would be copied beside the weights without a word. Whatever is chosen must fit the model: a
tokenizer with ids past its vocabulary is not its tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from implicit_megatron.config import Config

REPOSITORY = Path(__file__).resolve().parents[2]
SHIPPED = {"EleutherAI/gpt-neox-20b": REPOSITORY / "data/tokenizers/gpt-neox-20b.json.xz"}  # names a config.json uses
FOLDER_FILES = ("tokenizer.json", "tokenizer.model")


def matching_tokenizer(src: Path, hf: dict, cfg: Config, given: str | Path | None, base_config: str | Path | None
                       ) -> Path | None:
    """The tokenizer file to publish with the model `cfg` describes, imported from `src` (config.json
    `hf`); None for the --base-config's data.tokenizer, which the export's own rule then copies or
    refuses (hf.export.tokenizer_to_copy: a received config's private file only when named). ValueError
    when none is known or it does not fit the model."""
    own = next((src / name for name in FOLDER_FILES if (src / name).is_file()), None)
    named = hf.get("tokenizer") if isinstance(hf.get("tokenizer"), str) else None
    if given is not None:
        chosen, why = Path(given), "--tokenizer"
    elif own is not None:
        chosen, why = own, "the source folder's"
    elif base_config is not None:
        check_fits(Path(cfg.data.tokenizer), f"data.tokenizer of {base_config}", cfg.model.vocab_size, src)
        return None
    elif named in SHIPPED:
        chosen, why = SHIPPED[named], f"{named}, which {src / 'config.json'} names"
    else:
        said = f"names {named!r}, which this repository does not ship" if named else "names no tokenizer"
        raise ValueError(f"{src}: holds no tokenizer.json or tokenizer.model and its config.json {said}: name the "
                         "tokenizer the model was trained with (--tokenizer FILE; the paper's models: "
                         f"--tokenizer {SHIPPED['EleutherAI/gpt-neox-20b'].relative_to(REPOSITORY)})")
    check_fits(chosen, why, cfg.model.vocab_size, src)
    cfg.data.tokenizer = str(chosen)  # the run config the folder carries names what it holds
    return chosen


def check_fits(path: Path, why: str, vocab_size: int, src: Path) -> None:
    """A tokenizer whose ids reach past the model's vocabulary would index past its embedding."""
    from data_pipeline.tokenizer import load_tokenizer

    if not path.is_absolute() and not path.exists() and (REPOSITORY / path).exists():
        path = REPOSITORY / path  # a config's relative data.tokenizer, as training finds it
    ids = load_tokenizer(path).vocab_size
    if ids > vocab_size:
        raise ValueError(f"{path} ({why}) has token ids up to {ids - 1:,}, past the vocabulary of the model in "
                         f"{src} ({vocab_size:,} tokens): not its tokenizer; name the one it was trained with "
                         "(--tokenizer FILE)")
