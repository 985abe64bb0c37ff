package dataset

// pinnedPermutation is Permutation(10, 1, 0) as the first release computed it.
var pinnedPermutation = []int32{7, 6, 1, 3, 2, 4, 8, 9, 0, 5}
