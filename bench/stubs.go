package main

func benchTrain(args []string) error      { return nil }
func benchCheckpoint(args []string) error { return nil }
func trainRank(args []string) error       { return nil }
