# spark_master DEFAULTS_FILE [spark-submit args...]: print the master spark-submit will use.
# Sourced by spark-submit.sh; tests/unit/test_spark_master.py calls it directly.
# The order is spark-submit's own: --master, else --conf spark.master=..., else the properties
# file (--properties-file, or DEFAULTS_FILE). Parsing stops at the application (.py/.jar).
spark_master() {
  local props="$1"; shift
  local master="" conf_master="" prev="" a
  for a in "$@"; do
    case "$prev" in
      --master) master="$a" ;;
      --conf|-c) case "$a" in spark.master=*) conf_master="${a#spark.master=}" ;; esac ;;
      --properties-file) props="$a" ;;
      *) case "$a" in
           --master=*) master="${a#--master=}" ;;
           --conf=spark.master=*) conf_master="${a#--conf=spark.master=}" ;;
           --properties-file=*) props="${a#--properties-file=}" ;;
           *.py|*.jar) break ;;
         esac ;;
    esac
    prev="$a"
  done
  [ -n "$master" ] || master="$conf_master"
  if [ -z "$master" ] && [ -f "$props" ]; then
    master="$(awk '$1 == "spark.master" {print $2}' "$props" | tail -1)"
  fi
  printf '%s\n' "$master"
}
