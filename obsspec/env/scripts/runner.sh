# One agent command in the episode's persistent shell. Each command runs in a fresh bash (so a
# timeout can kill it without killing the episode), which first restores the state the previous
# command left (cwd, variables, functions, aliases, options, umask, $?) and saves it on exit.
# $1: the logical clock (epoch seconds) the command sees through libfaketime.
__obsspec_state=$OBSSPEC_STATE_DIR/shell
IFS= read -r -d '' __obsspec_cmd <&3; exec 3<&-   # the command, on a pipe from the supervisor
__obsspec_faketime=$OBSSPEC_FAKETIME_LIB __obsspec_det=$OBSSPEC_DETERMINISTIC
__obsspec_stdbuf=$OBSSPEC_STDBUF_LIB
unset "${!OBSSPEC_@}"   # the harness's variables are not part of the agent's environment
__obsspec_save() {
  __obsspec_rc=$?
  {
    printf 'cd -- %q 2>/dev/null\n' "$PWD"
    local __n __names=()
    for __n in $(compgen -v); do
      case $__n in
        __obsspec*|BASH*|EUID|UID|PPID|GROUPS|FUNCNAME|PIPESTATUS|LINENO|SECONDS|RANDOM|SRANDOM|\
        EPOCHSECONDS|EPOCHREALTIME|HISTCMD|_|DIRSTACK|SHLVL|PWD|SHELLOPTS|COMP_WORDBREAKS|\
        OPTIND|OPTERR|LD_PRELOAD|FAKETIME*|DONT_FAKE_MONOTONIC|_STDBUF_*) ;;
        *) __names+=("$__n") ;;
      esac
    done
    declare -p "${__names[@]}" 2>/dev/null
    for __n in $(compgen -A function); do
      case $__n in __obsspec*) ;; *) declare -f "$__n" ;; esac
    done
    alias -p
    umask -p
    shopt -p
    set +o
    printf '__obsspec_last=%d\n' "$__obsspec_rc"
  } > "$__obsspec_state"
}
__obsspec_last=0
[ -f "$__obsspec_state" ] && source "$__obsspec_state" 2>/dev/null
shopt -s expand_aliases
if [ "$__obsspec_det" = 1 ] && [ -n "$__obsspec_faketime" ]; then
  # An absolute FAKETIME freezes the wall clock: every process of this turn sees the same time.
  # Monotonic clocks stay real so that sleeps and timeouts inside commands still work.
  printf -v FAKETIME '%(%Y-%m-%d %H:%M:%S)T' "$1"
  export LD_PRELOAD=$__obsspec_faketime FAKETIME DONT_FAKE_MONOTONIC=1
fi
if [ "$__obsspec_det" = 1 ] && [ -n "$__obsspec_stdbuf" ]; then
  # Line-buffered stderr (coreutils' libstdbuf) for every stdio program: each error line is one
  # write, so two pipeline stages failing at once cannot interleave in the middle of a line.
  export LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}$__obsspec_stdbuf _STDBUF_E=L
fi
RANDOM=$1  # $RANDOM is seeded by the logical clock: the same numbers in every episode
trap __obsspec_save EXIT
__obsspec_status() { return "$1"; }
# `echo $?` shows the previous command's status. Left of `||` a failing status does not trip a
# `set -e` the agent left on (which used to end every later command before it ran).
# The supervisor runs `eval "$OBSSPEC_RUNNER"; eval "$__obsspec_run"` as line 1 of a `bash -c`, so
# bash numbers the command's lines from 1 whatever this file's length, as `bash -c COMMAND` does
# (`bash: line 1: foo: command not found`, not this file's line, which also moved with $?).
# `eval --`: a command that starts with a dash (`-l ls data`) is a command word, as in `bash -c`
# (`bash: line 1: -l: command not found`), not an option of eval (`eval: -l: invalid option`).
__obsspec_run='if [ "$__obsspec_last" = 0 ]; then eval -- "$__obsspec_cmd"; else __obsspec_status "$__obsspec_last" || eval -- "$__obsspec_cmd"; fi'
