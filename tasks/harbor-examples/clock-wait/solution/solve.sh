#!/bin/bash
cd /app
./warmup
date -u +%F > today.txt
