# obsspec sandbox supervisor: PID 1 of an episode's PID namespace (bwrap --as-pid-1).
#
# Protocol, on stdin, one request per command:   OP NONCE NBYTES ARG\n<NBYTES bytes of payload>
#   OP=run    : an agent command, run with the episode's persistent shell state (runner.sh);
#               ARG is the logical clock for this turn (epoch seconds) that the command sees.
#   OP=raw    : a harness script (the task's setup), run in a fresh bash with cwd = workdir.
#   OP=untar  : the payload is a tar archive, extracted into ARG: `workspace` (the task's files)
#               or `tests` (the verifier's files). The header never carries a path, so no
#               character of a task's fields can break it; every byte of the payload is read,
#               whether or not tar could write it all (rc: tar's).
#   OP=reset  : before verification: kill every other process and check that none is left
#               (rc 1 if one survived); then janitor.py empties /tests, /logs, the state dir
#               and /dev/shm, removes what the agent added to / and symlinks into the
#               verifier's files, opening directories the agent locked (rc 4 if anything
#               could not be undone, or a place that must be empty still holds blocks: the
#               agent tampered, the episode scores 0; rc 5 if the janitor could not run at all).
#   OP=verify : the task's verifier, in a fresh bash with cwd = workdir, an empty HOME and
#               TMPDIR, and a Python that ignores cwd, PYTHONPATH and user site-packages. Its
#               script reaches bash on a pipe, like agent commands: never a file in a tmpfs
#               the agent could have filled (a failed write left an empty test.sh: exit 0).
#   OP=reward : print the first bytes of /logs/verifier/reward.txt (rc 3 if it is not a file, or
#               if the verifier's run was interrupted or ended by a signal).
# Everything a request prints (stdout and stderr merged) goes to our stdout, followed by the
# end marker \0NONCE RC\0. The harness reads until the marker, so no output is ever lost to a
# race, and a command cannot forge the marker without knowing the nonce.
#
# Every process a request started is killed when it ends: background jobs live only as long as
# the command that started them (no core stays busy, no output lands in a later observation,
# nothing of the agent is alive when the verifier runs). Being PID 1, this shell survives
# `kill -9 -1` from inside; it runs from an execute-only copy of bash, so the kernel makes it
# non-dumpable and the agent can neither ptrace it nor touch its memory. On SIGUSR1 (sent by the
# harness when a command exceeds its timeout) it kills every other process in the namespace.

agent_lc_all=$LC_ALL
export LC_ALL=C   # read -N counts bytes; commands get the agent's locale back
exec 2>/dev/null
ulimit -u "$OBSSPEC_MAX_PROCS" -v "$OBSSPEC_MEMORY_KB" -f "$OBSSPEC_FILE_BLOCKS"
state=$OBSSPEC_STATE_DIR tests=$OBSSPEC_TESTS_DIR logs=$OBSSPEC_LOGS_DIR

__kill_others() {
  # A fork bomb may still be forking while we kill, so repeat until nothing else is left.
  # Unsandboxed (isolation=none) we are not PID 1 and kill only the command's own session.
  local i
  for ((i = 0; i < 100; i++)); do
    if [ $$ = 1 ]; then kill -KILL -1 || return 0; else kill -KILL -- "-$pid" || return 0; fi
  done
}
__others_alive() {
  # Is any process but us still running? (Zombies not yet reaped run nothing: they don't count.)
  # Builtins only: a forked helper would count itself.
  local d st
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = $$ ] && continue
    # the whole file (-d ''): a command name may hold a newline and fake a state on line one
    { read -r -d '' st < "$d/stat"; [ -n "$st" ]; } 2>/dev/null || continue  # gone meanwhile
    st=${st##*) }
    [ "${st%% *}" = Z ] || return 0
  done
  return 1
}
__interrupted=0 __verified=0
trap '__interrupted=1' USR1

# Every request runs in a session of its own: under PID 1's session, an agent command could
# lower the whole session's CPU share (/proc/self/autogroup) and PID 1's with it.
setsid="setsid -w"  # (-w: the exit status is the command's even where setsid had to fork)

__restamp() {
  # Files the kernel stamped with the real time get the episode's logical clock instead, so that
  # `ls -l` and `find -newer` print the same thing in every episode.
  [ "$OBSSPEC_DETERMINISTIC" = 1 ] || return 0
  # Unsandboxed (not PID 1), /tmp and HOME are the host's: only the workspace is ours to touch.
  local roots=("$OBSSPEC_WORKDIR")
  # Each of the sandbox's tmpfs mounts separately: -xdev keeps find on its start's filesystem.
  # A container's / is read-only (OBSSPEC_ROOT=readonly): nothing there to re-stamp.
  [ $$ = 1 ] && roots+=(/tmp "$HOME" /dev/shm "$logs" "$tests" "$state")
  [ $$ = 1 ] && [ "$OBSSPEC_ROOT" != readonly ] && roots+=(/)
  # Bounded: a tree the agent made deep and wide enough would otherwise keep us here past the
  # harness's patience (an infra error at will); what is not re-stamped in time keeps its time.
  # Access times too, which tar and every read stamp real (`ls -lu`, `stat`): of files only (our
  # find reads every directory), and alone (a read must not move the modification time).
  timeout -s KILL 3 find "${roots[@]}" -xdev \( -newermt "@$OBSSPEC_HORIZON" -exec touch -h -d "@$1" {} + \) \
    -o \( ! -type d -newerat "@$OBSSPEC_HORIZON" -exec touch -a -h -d "@$1" {} + \) 2>/dev/null
}

# What / itself (a small tmpfs) held before the agent's first command: bwrap's mount points.
# Kept here, in PID 1's memory, where the agent cannot add to it; the janitor gets it at reset.
declare -A __root_entries=()
if [ $$ = 1 ] && [ "$OBSSPEC_ROOT" != readonly ]; then
  while IFS= read -r -d '' __p; do __root_entries[$__p]=1; done < <(find / -xdev -mindepth 1 -print0 2>/dev/null)
fi

while IFS=' ' read -r op nonce nbytes arg; do
  script=""
  if [ "$op" = untar ]; then
    case $arg in workspace) dir=$OBSSPEC_WORKDIR ;; tests) dir=$tests ;; *) dir=/nonexistent ;; esac
    # The harness sends nothing more until we answer, so head cannot read past the archive; the
    # rest of the archive is drained when tar stops early (a full disk), so that no byte of it
    # is ever read as a request.
    # Only tar's first message comes back (one line: `tar: ...: No space left on device`).
    head -c "$nbytes" | { msg=$(tar -x --no-same-owner -C "$dir" 2>&1); r=$?; cat >/dev/null
                          printf '%s' "${msg%%$'\n'*}"; exit "$r"; }
    rc=$?
    __restamp "$OBSSPEC_CLOCK_START"
    printf '\0%s %d\0' "$nonce" "$rc"
    continue
  fi
  [ "$nbytes" -gt 0 ] && IFS= read -r -d '' -N "$nbytes" script
  __interrupted=0
  case $op in
    # The command text reaches its shell on a pipe (fd 3), never through a path the agent can
    # write: a FIFO or a link to PID 1's own stdin planted there hung or steered us.
    run)
      # (oom_score_adj 1000: out of memory, the kernel kills the agent's processes before PID 1)
      LC_ALL=$agent_lc_all $setsid bash --noprofile --norc -c 'echo 1000 2>/dev/null >/proc/self/oom_score_adj; eval "$OBSSPEC_RUNNER"; eval "$__obsspec_run"' bash "$arg" \
        </dev/null 3< <(printf '%s' "$script") 2>&1 & ;;
    raw)
      (cd "$OBSSPEC_WORKDIR" && LC_ALL=$agent_lc_all exec $setsid bash --noprofile --norc /dev/fd/3) \
        </dev/null 3< <(printf '%s' "$script") 2>&1 & ;;
    reset)
      if [ $$ = 1 ]; then  # (unsandboxed, each command's session was killed when it ended)
        # A killed process holding a lot of memory takes a while to go: poll for up to ~10 s
        # (without the pauses, a 1 GB process outlived the loop: an infra error at will).
        for ((i = 0; i < 200; i++)); do __others_alive || break; __kill_others; sleep 0.05; done
        if __others_alive; then printf '\0%s %d\0' "$nonce" 1; continue; fi
        # A / the agent made unsearchable leaves us no program to run (it owns /; nothing here
        # can chmod without one): the agent locked the sandbox, and that scores 0.
        if [ ! -x / ]; then echo "/ is locked"; printf '\0%s %d\0' "$nonce" 4; continue; fi
        where=sandboxed
        [ "$OBSSPEC_ROOT" = readonly ] && where=container  # (no / of the agent's to sweep)
      else
        where=host
      fi
      # rc 4: something the agent left could not be undone (the episode scores 0)
      printf '%s\0' "${!__root_entries[@]}" |
        python3 -I -c "$OBSSPEC_JANITOR" "$where" "$tests" "$logs" "$state" "$OBSSPEC_WORKDIR" "$HOME" 2>&1
      rc=$?
      # 137: the kernel's OOM killer (no agent process is left to send SIGKILL): the memory is
      # held by what the agent left, since the tmpfs sizes leave the harness its own (podman.py)
      [ "$rc" = 137 ] && { echo "the janitor ran out of memory the agent's files hold"; rc=4; }
      [ "$rc" = 0 ] || [ "$rc" = 4 ] || rc=5  # 5: ours, not the agent's (the janitor could not run)
      # (the janitor found these places empty: a write that fails now is not the agent's doing)
      if [ "$rc" = 0 ]; then mkdir -p "$logs/verifier" "$state/home" "$state/tmp" 2>&1 || rc=5; fi
      printf '\0%s %d\0' "$nonce" "$rc"
      continue ;;
    verify)
      __verified=0  # set only when this run ends uninterrupted (see `reward`)
      (cd "$OBSSPEC_WORKDIR" && HOME=$state/home TMPDIR=$state/tmp PYTHONSAFEPATH=1 PYTHONNOUSERSITE=1 \
        LC_ALL=$agent_lc_all exec $setsid bash --noprofile --norc /dev/fd/3) \
        </dev/null 3< <(printf '%s' "$script") 2>&1 & ;;
    reward)
      # A reward file counts only after a verifier run that nobody interrupted: code of the
      # agent's that a verifier runs can write the file and then hang, or SIGUSR1 us, to be
      # killed before the verifier overwrites it (the verifier then failed: exit status only).
      rc=3 f=$logs/verifier/reward.txt
      if [ "$__verified" = 1 ] && [ -f "$f" ] && [ ! -L "$f" ]; then head -c 64 -- "$f"; rc=0; fi
      printf '\0%s %d\0' "$nonce" "$rc"
      continue ;;
    *) printf '\0%s %d\0' "$nonce" 2; continue ;;
  esac
  pid=$!
  wait "$pid"; rc=$?
  __interrupted_any=$__interrupted
  while [ "$__interrupted" = 1 ]; do
    __interrupted=0 __interrupted_any=1
    __kill_others
    wait "$pid"; rc=$?
  done
  __kill_others  # the command is over: so is everything it started
  # (a verifier that ended by a signal is no verdict either: code of the agent's that it ran could
  # write the reward file and then kill it, or the shell running test.sh, with `kill -9 -1`)
  [ "$op" = verify ] && [ "$__interrupted_any" = 0 ] && [ "$rc" -lt 128 ] && __verified=1
  __restamp "$arg"
  printf '\0%s %d\0' "$nonce" "$rc"
done
