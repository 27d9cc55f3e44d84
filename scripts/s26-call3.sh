export MOEKIT_COMMIT=cacdc06
bash scripts/device.sh prebuilt test sanitize
cp $OUT/summary.txt $OUT/s1.txt
grep -E "FAILED|Failure|rror" -A6 $OUT/tests.log | head -150 > $OUT/testfail.txt
grep -E "ERROR SUMMARY|RACECHECK|Invalid|Race" $OUT/sanitizer.log | sort | uniq -c | head -40 >> $OUT/testfail.txt
rm -f $OUT/tests.log $OUT/sanitizer.log
MOEKIT_BENCH_TOKENS=2,4,8 MOEKIT_AB_ENVS="cli=.prebuilt/base-moekit;-" MOEKIT_AB_ROUNDS=2 bash scripts/device.sh prebuilt envab
cp $OUT/summary.txt $OUT/s2.txt
bash scripts/device.sh prebuilt bench torch
rm -f $OUT/*.json
