"""A few short documents for the framework pipelines, and the query they answer."""

DOCS = [
    ("eiffel", "Eiffel Tower", "The Eiffel Tower stands on the Champ de Mars in Paris. It was built in 1889 as the "
     "entrance to the World's Fair. Its designer's company was run by Gustave Eiffel. The tower is 330 metres "
     "tall. About seven million people visit it each year."),
    ("saturn", "Saturn", "Saturn is the sixth planet from the Sun. It has 146 known moons. Its rings are made "
     "mostly of ice. Titan is its largest moon."),
    ("tulsa", "Tulsa", "Tulsa is the second-largest city in Oklahoma. It was founded in 1836 by the Lochapoka "
     "Band of Creek Native Americans. The city lies on the Arkansas River."),
]
QUERY = "When was the Eiffel Tower built?"
