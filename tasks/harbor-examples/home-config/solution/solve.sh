#!/bin/bash
mkdir -p ~/.config/notes
cat > ~/.config/notes/config.ini <<'INI'
[user]
name = Ada Lovelace
email = ada@example.org
[store]
dir = ~/notebook
INI
notes add first steps
notes list
