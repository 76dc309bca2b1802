"""A byte-level BPE tokenizer trained on the task corpus, shared by the policy and the world model.

    tok = train_tokenizer(corpus_texts(trajectories), vocab_size=4096)
    tok.save_pretrained("kit/tokenizer")          # AutoTokenizer.from_pretrained("kit/tokenizer")

- Byte-level: every string encodes, and `decode(encode(s)) == s` (no normalizer, no cleanup).
- Pre-tokenization keeps names stable: a run of letters is one piece whatever stands before
  it (no leading space or slash is glued on, unlike Qwen2/3's split), digits and punctuation are
  single characters (`kit.digits_per_token` lets a run of up to 3 digits be one piece, below),
  spaces and newlines are runs of their own. So `onyx` in `/app/onyx.zip`,
  in ` onyx.zip` and in `onyx` encodes to the same ids, and a small model can copy a name from
  the instruction into a command by copying tokens (tested).
- Special tokens `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos); `<tool_call>`,
  `</tool_call>`, `<tool_response>`, `</tool_response>` are atomic added tokens that are NOT
  special (as in Qwen3), so `decode(..., skip_special_tokens=True)` keeps them. Ids 0..6, in
  that order; then the call markup (`<function=bash>`, `<parameter=command>`, `</parameter>`,
  ...), atomic and not special either, ids 7..12.
- Listing fields (`listing_atoms`): the parts of an `ls -l` line that repeat on every line of a
  listing in this corpus — the mode (`-rw-r--r--`), the link count with owner and group
  (` 1 agent agent `), the date (` Jan  1 00:00 `) — are atomic tokens too, ids 13.. . A listing
  line is then ~11 tokens instead of ~34, and the name of the line before (the only clue to which
  line of a listing comes next) sits ~7 tokens back: in a synthetic probe the tiny world model
  learned to copy listings with them and not without (bench/listing_copy.py in commit f5140f4); on the embedded
  suite's 360 real listings it does not yet (docs/WORLDMODEL.md).
- A Qwen3-like `chat_template` (system/user/assistant/tool messages) whose text for a trajectory
  is exactly the layout of obsspec/tokens.py.
- Deterministic: the same texts give a byte-identical `tokenizer.json`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from obsspec import chat
from obsspec.tokens import AFTER_OBS, ENDOFTEXT, IM_END, IM_START, OBS_PREFIX, prompt_text

SPECIAL = (ENDOFTEXT, IM_START, IM_END)
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# The rest of the call markup (obsspec/chat.py `render_tool_call`), one token each: a tiny policy
# then spends its capacity on the command, not on spelling the XML around it.
CALL_TAGS = ("<function=bash>", "<function=done>", "<parameter=command>", "<parameter=timeout>",
             "</parameter>", "</function>")
TAGS = (*SPECIAL, *TOOL_TAGS, *CALL_TAGS)  # ids 0..12, in this order
# Pieces: a word (letters only), a digit (or a run of up to `digits` digits, cut from the left),
# one punctuation mark, a run of newlines, a run of other whitespace. Nothing joins a word to what
# precedes it, so a name keeps its ids.
def split_pattern(digits: int = 1) -> str:
    number = r"\p{N}" if digits == 1 else rf"\p{{N}}{{1,{digits}}}"
    return rf"\p{{L}}+|{number}|[^\s\p{{L}}\p{{N}}]|[\r\n]+|[^\S\r\n]+"

# A GNU `ls -l` line: mode, then (padded) link count, owner and group, then the size, then the
# date ("Jan  1 00:00", or "Jan  1  2024" for an old file), then the name.
LS_LINE = re.compile(r"^([-dlbcps][-rwxsStT]{9})( +\d+ \S+ +\S+ ) *\d+( \w{3} [ \d]\d (?: \d{4}|\d\d:\d\d) )\S",
                     re.MULTILINE)
MAX_LISTING_ATOMS = 24
MIN_LISTING_LINES = 8  # a field must start (or sit in) this many listing lines of the corpus

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def corpus_texts(trajectories: Iterable[dict]) -> list[str]:
    """One text per trajectory, laid out as the policy sees it (obsspec/tokens.py).

    `trajectories` are rows of a suite's trajectories.jsonl: instruction + steps [{command,
    observation}]. The tools description is in every prompt, so its words become few tokens.
    """
    texts = []
    for row in trajectories:
        parts = [prompt_text(row["instruction"])]
        for step in row["steps"]:
            parts += [chat.render_bash(step["command"]), IM_END,
                      OBS_PREFIX, step["observation"], chat.OBS_CLOSE, AFTER_OBS]
        parts += [chat.render_done(), IM_END]
        texts.append("".join(parts))
    return texts


def listing_atoms(texts: Iterable[str]) -> list[str]:
    """The `ls -l` fields seen on at least MIN_LISTING_LINES lines of `texts`, most frequent first
    (ties in text order), at most MAX_LISTING_ATOMS: [] for a corpus without listings."""
    counts: Counter[str] = Counter()
    for text in texts:
        for line in LS_LINE.finditer(text):
            counts.update(line.groups())
    # (an owner named like a tag must not swallow it)
    common = [f for f, n in counts.most_common()
              if n >= MIN_LISTING_LINES and not any(t in f for t in TAGS)]
    return common[:MAX_LISTING_ATOMS]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, digits: int = 1) -> PreTrainedTokenizerFast:
    """Train the BPE on `texts` (in order) and wrap it as a transformers tokenizer; `digits`: the
    longest run of digits one pre-token holds (1: every digit alone; 3: `389` can be one token)."""
    texts = list(texts)
    atomic = [*TAGS, *listing_atoms(texts)]
    cut = re.compile("|".join(re.escape(t) for t in sorted(atomic, key=len, reverse=True)))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_pattern(digits)), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=atomic,  # ids 0..12, then the listing atoms
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # The atomic tokens are cut out of the training text so that no merge is spent on their pieces.
    pieces = (piece for text in texts for piece in cut.split(text) if piece)
    tok.train_from_iterator(pieces, trainer)
    # The trainer registers all of them as special; only SPECIAL are (tags and atoms are ordinary
    # added tokens, kept by `decode(..., skip_special_tokens=True)`).
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] in SPECIAL
    return wrap(Tokenizer.from_str(json.dumps(spec)))


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE,
    )
