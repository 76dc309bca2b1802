#!/bin/bash
cd /app && ./tools/summarize.sh > report.txt
